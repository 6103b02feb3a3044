package frontend

import "encoding/json"

// choiceBody is the body choice i of a request with n > 1 runs with: the
// client's body, with a seed s made s+i, so that seeded choices differ (as
// the n choices of one request do on the model server) while each stays
// reproducible. Choice 0 and bodies without an integer seed are unchanged.
func choiceBody(body json.RawMessage, i int) json.RawMessage {
	if i == 0 || len(body) == 0 {
		return body
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	var seed *int64
	if json.Unmarshal(fields["seed"], &seed) != nil || seed == nil {
		return body
	}
	fields["seed"], _ = json.Marshal(*seed + int64(i))
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}
