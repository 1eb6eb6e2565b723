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
// route draws its own latency, as a real duplicate would.
//
// An answer's text is a function of the conversation alone and its length
// of the conversation and the output cap, drawn from the workload's token
// model with a fixed seed, not the route's: the same whatever Seed, Route
// or stream, in every API (FullText computes it). The cap truncates that
// text, as a real model's does.
//
// A route may continue an answer from partial assistant output
// (Options.Continuation, continuation.go) in one provider's style:
// Anthropic's prefill, vLLM's continue_final_message or DeepSeek's prefix.
// The conversation before the partial keys the full text; a partial that
// is a prefix of it, byte for byte (ending anywhere, inside a word too), is
// answered with exactly the rest, its input tokens the conversation's plus
// those the partial touched, its cap counting only the new tokens; any
// other partial is refused 400, and so is another style's request.
//
// A route may break a seeded share of its streams after N content tokens
// (Options.BreakShare, BreakAfter, BreakMode; breaks.go): cut the
// connection, send the API's in-band error event, stall until the client
// leaves — or, with Options.BreakStallFor, for that much model time, after
// which the stream resumes and completes with the same text —, send one
// malformed event (not JSON) and end, or end normally but early at the
// length limit (truncate: finish length, Responses' incomplete
// max_output_tokens, Anthropic's max_tokens, the usage the tokens sent).
// Continuations never break, so a rescue can finish what a break left.
//
// Times have two clocks. Model time is what the workload draws (first byte,
// token arrivals, error delays, Retry-After, the cancellation lag); the
// server waits the real equivalent, model × TimeScale. Records in /stats keep
// both: wall-clock timestamps (unix milliseconds) for joining with a load
// generator's own, and model times for checking against the draw.
//
// Token counts are the workload's, not the prompt's: prompt_tokens is the
// conversation's drawn input size, and the answer is deterministic filler,
// one word per token (each after the first with its leading space),
// identical on every route.
package fakellm
