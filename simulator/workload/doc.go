// Package workload holds the seeded latency, token, error and degradation
// models of docs/architecture.md §11 and the pinned evaluation conditions every strategy
// comparison uses.
//
// The package is pure: no goroutines, no wall clock. Every draw is a function
// of a seed and the identity of what is drawn (request id; request, route and
// attempt number), so the discrete-event simulator (virtual time) and the fake
// OpenAI-compatible server (real time through a TimeScale) replay the same
// workload from the same seed. Times are model time: a time.Duration since
// the start of the run, or since the start of an attempt where a method says
// so.
//
// The layers are:
//   - Model: the parameters of one named workload (ByName).
//   - Generator: a Model with a seed; it makes Requests (properties of the
//     request: input and output tokens) and Providers.
//   - Provider: one route. Its Attempt method draws one attempt of a request
//     starting at a given time, applying the route's degradation schedule and
//     rate limit, which is why it holds state over time.
//   - Attempt: the drawn outcome, with first byte, token arrival times and the
//     usage a provider bills after a disconnect (cancellation lag).
package workload
