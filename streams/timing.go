package streams

// HeaderUpstreamTTFT is put by a worker on the first token delta of each
// attempt (a CloudEvents extension attribute, which events.Unmarshal
// ignores): the time, in whole microseconds, from the worker's call to its
// engine to the engine's first token. A frontend subtracts it from the time
// to first token its client saw: what baton added
// (baton_frontend_added_ttft_seconds, the Server-Timing header).
const HeaderUpstreamTTFT = "ce-upstreamttftus"
