// Package quota keeps per-tenant budgets (requests and tokens per minute)
// as one budget across every frontend, in the JetStream KV bucket
// streams.BudgetsBucket.
//
// Each per-minute budget of L is a token bucket of burst B = max(1, L/10)
// (whole units) refilled at (L-B+1)/60 per second, so that no 60-second
// window, the first one included, admits more than L. One key per tenant
// holds its buckets' levels and the leases frontends hold of them: a
// frontend takes a slice of the budget with one compare-and-set and spends
// it locally, returning what is left when its lease ends (every Lease,
// default 2 s). While a lease is held its slice counts as spent; a
// frontend that dies holding one loses that slice for at most one lease
// period (the bucket then refills past it). Checks that the local slice
// covers cost no network call.
//
// LogShares adds up, in the same bucket, each frontend's count of the
// bytes each tenant stores in the request log (one key per frontend), for
// the tenants' shares of the log (log=F).
//
// A Limiter and a LogShares are safe for concurrent use. Parse reads a
// budgets file.
package quota
