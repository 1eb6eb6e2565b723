// Package upstream runs one attempt of a chat request against one provider
// route: the worker's only door to a provider. An Upstream makes exactly one
// HTTP request per call and never retries on its own — retries, hedges and
// replacements are the hedge engine's decisions, and a hidden retry would be
// load that no duplicate-rate or spend ceiling could see (docs/architecture.md §4, §7).
//
// The OpenAI adapter speaks the Chat Completions API of OpenAI and of the
// servers compatible with it (the simulator, vLLM and others). It always
// streams from the provider, with stream_options.include_usage set, even when
// the caller wants a single answer: the stream makes the first byte and each
// token observable, which the hedge trigger and the first_token commit point
// need, and its final chunk carries the provider's own usage report.
//
// Apart from model, stream and stream_options, which are the route's and the
// worker's, an OpenAI-compatible route receives the caller's request as sent:
// the typed fields, the output cap under the name the caller used
// (max_completion_tokens stays max_completion_tokens), and every other member
// in ChatRequest.Extra (docs/architecture.md §8, "Request fidelity").
//
// A caller of OpenAI's Responses API (schemas.DialectResponses) is served at
// the provider's {base_url}/responses instead, with its members as sent;
// the Responses semantic events are read back into the same deltas and
// Outcome (responses.go): output text, function calls as tool-call
// fragments, usage and the finish reason from response.completed or
// response.incomplete. response.created and response.in_progress carry no
// output.
//
// A continuation attempt (issue 30) goes through Continue instead of
// Stream, on a route configured with a ContinuationStyle: the request plus
// the partial answer the caller has as the final assistant message —
// Anthropic's prefill, vLLM's and SGLang's continue_final_message,
// DeepSeek's prefix — and only the text after that answer is reported
// (continuation.go; docs/architecture.md §6, "Continuation attempts").
//
// # Streams
//
// The adapter reads Server-Sent Events: "data:" lines (several form one
// event, joined by newlines), comments such as ": ping" (ignored, they are
// keep-alives), blank lines ending an event, and "data: [DONE]" ending the
// stream. Each event is a chat.completion.chunk; only choice 0 is read, since
// the adapter never asks for n > 1. An event of type "error", or a chunk with
// an "error" object, is a provider error sent after the 200 and is classified
// like an HTTP error (below, the "mid-stream" column).
//
// A stream is well-formed (Outcome.WellFormed) when every chunk parsed, choice
// 0 carried a finish_reason and "[DONE]" arrived. What goes wrong decides the
// result:
//   - a finish_reason then the end of the body without "[DONE]": the answer is
//     complete, so Stream returns it with no error but WellFormed=false, and the
//     arbiter decides whether the contract accepts it;
//   - the body ends, or the connection breaks, before any finish_reason: the
//     stream was cut mid-way, a transient server_error (timeout if the context's
//     deadline passed; canceled if the caller cancelled);
//   - a chunk that is not valid JSON or not a chunk, or a line longer than
//     MaxEventBytes: a transient server_error; the adapter stops reading a
//     stream it can no longer trust.
//
// # First byte
//
// Sink.FirstByte marks the first token the model generated, in either
// dialect: content text, a refusal, a tool call (its id or name appearing,
// or argument text), reasoning (reasoning_content or reasoning deltas;
// Anthropic thinking_delta and redacted thinking), Anthropic text_delta and
// input_json_delta, and a tool_use block's start. The response headers are
// not a first byte, nor is anything a provider sends before its model
// produces: an empty role chunk, an empty delta, message_start, ping, an
// empty text or thinking block's start, SSE comments and keep-alives.
// Providers open the stream at once and then wait for the model, so a stall
// behind an open stream is exactly the tail the hedge trigger must see.
//
// After the first token each next one must come within the stall bound —
// the one WithStallAfterFirstToken put in the call's context (the worker
// passes the attempt's, which the dispatcher derives from the cohort's
// inter-token gaps), else Options.StallAfterFirstToken
// (DefaultStallAfterFirstToken, 2 s): a
// per-token idle timer, which pings, keep-alives and empty deltas do not
// re-arm, cuts a stream silent that long and fails it as a transient
// server_error, so the attempt is replaced (before its commit) or its
// committed stream ends with an error, not at the deadline
// (docs/architecture.md §4 rule 4). The outcome reports the longest gap
// between tokens it saw (Outcome.MaxTokenGap), those gaps' source.
//
// # Tokens and usage
//
// Output is counted one token per chunk that carries content, a refusal,
// reasoning or tool-call fragments, and Delta.Tokens is that count for the
// chunks delivered (refusals and reasoning are billed, never delivered):
// OpenAI streams about one token per chunk, and the
// figure only feeds commit points of the form tokens:N and progress estimates.
// When a chunk carries its own running usage (servers with continuous usage
// statistics), the increase of completion_tokens is used instead.
//
// Outcome.Usage is the provider's final usage chunk when one arrived
// (prompt_tokens, completion_tokens). Otherwise — the stream was cut,
// cancelled, or the provider sent none — it is estimated and flagged: output
// units are the counted tokens, input units are the last reported
// prompt_tokens or else the request body's length in bytes divided by four, a
// deliberate over-estimate, since spend ceilings must not under-count.
// Rejected requests (any non-2xx answer) and connections that were never
// established report zero usage: providers do not bill them.
//
// # Error classification
//
// Every error Stream returns is an *Error whose Scope tells the hedge engine
// how far the failure reaches (docs/architecture.md §4 rule 4):
//
//	HTTP status / condition                  Status           Scope
//	400, 413, 422 (invalid_request_error,    invalid_request  group
//	  context_length_exceeded, and input
//	  policy codes content_filter /
//	  content_policy_violation)
//	any status with code model_not_found     not_found        route
//	401, 402, 403                            auth             route
//	404, 405                                 not_found        route
//	other 4xx                                invalid_request  route
//	3xx (redirects are never followed)       not_found        route
//	200 that is not an event stream          server_error     route
//	408                                      timeout          transient
//	409, 500, 502, other 5xx                 server_error     transient
//	504                                      timeout          transient
//	503 without Retry-After                  server_error     transient
//	503 with Retry-After or retry-after-ms   overloaded       pushback
//	429                                      rate_limited     pushback
//	429 with code insufficient_quota         rate_limited     route
//	529                                      overloaded       pushback
//	connection refused / reset / early EOF,  server_error     transient
//	  stream cut before finish_reason,
//	  malformed chunk, no token for the
//	  stall bound after the first
//	transport timeout, context deadline      timeout          transient
//	context cancelled by the caller          canceled         none
//
// A quota that is used up (insufficient_quota) is a billing state, not load:
// waiting for Retry-After would not cure it, so the route is quarantined
// instead of paused. A 503 that names a time to come back is the provider
// asking for less load, which the engine must not answer with a hedge.
//
// Mid-stream errors carry no status, so their error type or code decides:
// invalid_request_error, request_too_large and the input codes above are
// group-scoped; authentication_error, permission_error and billing_error are
// route auth; not_found_error is route not_found; rate_limit_error and
// rate_limit_exceeded are pushback rate_limited; overloaded_error and
// server_is_overloaded are pushback overloaded; timeout_error is a transient
// timeout; anything else (api_error among them) is a transient server_error.
//
// Retry-After is read from retry-after-ms (milliseconds, OpenAI's precise
// form) when present, else from Retry-After as delay-seconds or an HTTP date
// measured against the injected clock; values beyond MaxRetryAfter are
// clamped so that a garbled header cannot park a route for days.
//
// Error messages keep nothing the provider wrote freely (providers echo
// prompts, keys and headers in any field): they hold the HTTP status, the
// error type and code only when they are in the providers' published
// vocabulary, the top-level request member a param names when it is one,
// a fixed description of the failure class, and the length of the
// provider's message, which is withheld. Request and response bodies,
// headers and keys never appear in them (docs/architecture.md §9).
//
// # Anthropic Messages
//
// The Anthropic adapter speaks the Messages API (anthropic-version
// 2023-06-01, key in x-api-key) and hands the worker the same Delta and
// Outcome as the OpenAI adapter, so the hedge engine, the arbiter and the
// front doors never see which dialect a route speaks:
//   - the canonical request is translated: system and developer messages
//     become the system prompt, tool messages user turns with tool_result
//     blocks, assistant tool calls tool_use blocks, image_url parts image
//     blocks, tools and tool_choice Anthropic's shapes; max_tokens, which the
//     API requires, is the request's or the route's default;
//     parallel_tool_calls false is disable_parallel_tool_use; the caller's
//     other members (ChatRequest.Extra) go as sent from a Messages caller,
//     translated from an OpenAI caller (user → metadata.user_id); what the
//     API lacks (penalties, seed, a JSON response_format, logit_bias, ...)
//     ends the group as a group-scoped invalid_request before anything is
//     sent (schemas.ChatRequest.ForDialect; docs/architecture.md §8);
//   - text_delta events are content deltas; a tool_use block and its
//     input_json_delta events are tool-call deltas in OpenAI's fragment
//     shape, indexed by tool call; thinking is counted but not delivered;
//   - stop_reason maps to the canonical finish reason (FinishReason):
//     end_turn and stop_sequence → stop, max_tokens → length, tool_use →
//     tool_calls, refusal → content_filter;
//   - usage is message_start's input_tokens (with cache reads and writes)
//     and message_delta's cumulative output_tokens; a stream cut before its
//     message_delta is estimated as above, from the larger of the reported
//     and the counted output;
//   - the stream is well-formed when a stop_reason and message_stop arrived.
//     An "event: error" is classified by its error type as in the mid-stream
//     rules above; HTTP errors use the same table (Anthropic's 529
//     overloaded_error and 429 rate_limit_error are pushback, honouring
//     retry-after).
package upstream
