// Package worker is hedgerow's stateless attempt runner: it takes attempts of
// one route from NATS, runs each against the route's provider through an
// upstream.Upstream, and reports progress and the outcome to the dispatcher
// that sent it (docs/architecture.md §2, §8).
//
// # Subjects
//
// The wire's names are schemas' (docs/architecture.md §8). A Worker
// subscribes to schemas.AttemptSubject(route) in the queue group
// schemas.WorkerQueueGroup(route), so each attempt reaches one worker of the
// route, and to one control inbox of its own, named in every Accept, on
// which the dispatcher sends Cancels. It registers the NATS micro service
// schemas.WorkerServiceName with the route in its metadata, so readiness
// checks can ping $SRV.PING.hedgerow-worker, and publishes each attempt's
// sanitized schemas.AttemptRecord on schemas.AttemptRecordSubject. A worker
// of a region (Options.Region) uses the region's names instead
// (schemas.RegionWire(region): hedgerow.<region>.attempt.<route>, …), so on
// a supercluster it takes only its own region's attempts.
//
// # One attempt on the reply inbox
//
// Every message of an attempt is published from one goroutine at a time on
// one connection, so the dispatcher receives them in this order:
//
//	Busy                                   (at the in-flight limit, or stopping)
//	Accept, Heartbeat*, FirstByte?, (Chunk | Heartbeat)*, AttemptResult
//
// Accept is sent as soon as the attempt is decoded. Heartbeats (Seq from 1)
// follow every HeartbeatInterval until the AttemptResult — after the first
// token too, except in an interval in which a chunk went out — so the
// dispatcher notices a worker lost mid-answer within its heartbeat timeout
// (docs/architecture.md §4 rule 4); FirstByte
// is sent once, at that token (upstream.Sink.FirstByte) — not when the
// provider's stream opens, since providers open it long before the model
// produces anything, and an open stream that stalls must stay hedgeable
// (docs/architecture.md §4 rule 2). Chunks
// (streaming callers only) have Seq from 1 without gaps: the chunk holding
// the first content or tool-call token is sent at once with First set, later
// output is coalesced until CoalesceTokens tokens or CoalesceDelay after the
// first unflushed token. AttemptResult ends the attempt and carries LastSeq,
// so a lost trailing chunk shows as a gap. A non-streaming caller gets no
// chunks: its whole answer is in the AttemptResult.
//
// # Cancels
//
// A Cancel for a running attempt cancels its upstream call at once (the
// adapter closes the provider connection) and the attempt reports
// status canceled with cancellation_observed set and the usage it observed;
// estimating what the provider billed after the disconnect is the
// dispatcher's job (budgets.EstimateCancelled). A Cancel for an attempt the
// worker has not seen yet is remembered for PendingCancelTTL: if the attempt
// arrives within it, the worker accepts it and reports it cancelled at once,
// without calling the provider. A Cancel for an attempt that already ended
// is ignored.
//
// # Deadlines and shutdown
//
// An attempt's upstream call is bounded by Attempt.EffectiveDeadline, the
// earlier of the absolute deadline and the remaining budget measured on the
// worker's clock; reaching it reports status timeout, scope transient.
// Stop stops taking work at once — attempts still queued in the client are
// answered Busy so the dispatcher offers them to another worker — lets in-flight
// attempts finish within DrainGrace, then cancels the rest, which report
// status canceled with scope transient (the dispatcher may replace them).
//
// # Route in-flight leases
//
// With Options.Leases set (the shared budget store when redis.url is set),
// the worker holds a lease on its route for each attempt it runs, so every
// dispatcher replica's route choice sees the cluster's load on the route
// (docs/architecture.md §7). The holder is "<worker id>/<group id>/<attempt>", ids the
// dispatcher and the worker drew. One goroutine of the worker acquires the
// lease soon after the attempt starts, renews it every LeaseRenewInterval
// and releases it when the attempt ends; the attempt itself never waits
// for the store. A lease lives LeaseTTL without renewal, so the leases of
// a worker that dies expire. A store that fails costs a count in
// hedgerow_worker_lease_errors_total and a log line at most every 30 s;
// the keeper then retries at its next tick. Stop releases what is held.
//
// Nothing about an attempt outlives it but a remembered early Cancel. No
// prompt, output, header or key is logged, recorded or used as a metric label.
package worker
