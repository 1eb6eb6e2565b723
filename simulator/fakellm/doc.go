// Package fakellm is an OpenAI-compatible chat completions server whose
// latencies, token counts, errors, hangs and degraded episodes come from the
// seeded workload models of docs/architecture.md §11 (package simulator/workload), played
// in real time through a TimeScale.
//
// It speaks Anthropic's Messages API too, on POST /v1/messages: the same
// draw, timing and billing, written as Messages answers, streaming events
// (message_start, content_block_*, message_delta with the cumulative output
// tokens, message_stop) and errors ({"type":"error","error":{...}}). The
// conversation keys the draw in the chat API's terms, so the same text asked
// in either API draws the same answer; max_tokens, which Messages requires,
// counts as no cap when the model's longest answer fits under it.
//
// It speaks OpenAI's Responses API on POST /v1/responses likewise: the
// instructions and input read as the chat conversation they stand for, the
// answer a response object, or its semantic events (response.created ...
// response.output_text.delta ... response.completed, or
// response.incomplete when max_output_tokens cut it).
//
// It serves OpenAI embeddings on POST /v1/embeddings (embeddings.go): the
// draw of a one-token answer sets the call's latency, errors and hangs, and
// each vector is a function of its input text alone (EmbeddingVector), so a
// hedge's vectors are the primary's on every route and seed; dimensions and
// base64 encoding are honoured, token arrays refused.
//
// One Server plays one route of a model. Every route of a run must use the
// same workload and Seed: the request id is derived from the canonical body
// (messages and the output cap), so a hedge of a request sent to another
// route draws the same output length and content but its own latency, as
// a real duplicate would.
//
// Times have two clocks. Model time is what the workload draws (first byte,
// token arrivals, error delays, Retry-After, the cancellation lag); the
// server waits the real equivalent, model × TimeScale. Records in /stats keep
// both: wall-clock timestamps (unix milliseconds) for joining with a load
// generator's own, and model times for checking against the draw.
//
// Token counts are the workload's, not the prompt's: prompt_tokens is the
// request's drawn input size, and the answer is deterministic filler, one
// word per token, identical on every route.
package fakellm
