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
// Slots keeps each tenant's concurrent=N as one cap across every
// frontend: one key per tenant (c.<tenant>) holds the slots each frontend
// holds and until when. A frontend takes a slot with one compare-and-set,
// refused when the live holdings of all add up to N (one read more when
// its view is stale), gives it back with another when the request ends,
// and renews its holdings every Lease/3 (a write with a new end, Lease
// later). The bound of its error: the frontends together never hold more
// than N as the key records it. They may admit fewer: a slot given back
// counts until its write lands (milliseconds), and the slots of a frontend
// that dies count until its last lease ends, at most one Lease (default
// 2 s). They may run more than N in one case: a frontend cut off from the
// bucket for over a Lease keeps serving the streams it had open while its
// entry lapses and the others admit up to N again (it admits nothing new:
// its checks fail closed), until those streams end. Leases end by each
// holder's clock, so clocks must agree within a fraction of the Lease.
//
// LogShares adds up, in the same bucket, each frontend's count of the
// bytes each tenant stores in the request log (one key per frontend), for
// the tenants' shares of the log (log=F).
//
// Fair is weighted fair admission's virtual token counter (VTC, OSDI
// '24): a tenant's counter is the service admitted for it over its weight,
// the largest lift any frontend gave it added, and the frontend's queue
// admits the queued tenant with the lowest. Each frontend's FairShare
// writes its part (service, lift, queue lengths) under vtc.<frontend>,
// at most every FairInterval, and applies the others' as they come: a sum
// and a maximum, so views agree in any order. A frontend holds back while
// a tenant queued elsewhere is behind its own best by more than one
// request's charge; views up to ~150 ms late let two backlogged counters
// drift apart by about that much, a bounded error, not a cumulative one.
//
// A Limiter, a LogShares and a Fair are safe for concurrent use. Parse
// reads a budgets file.
package quota
