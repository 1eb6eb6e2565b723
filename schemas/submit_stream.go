package schemas

import (
	"encoding/json"
	"regexp"
)

// The hedgerow.submit front door over NATS (docs/architecture.md §8): the NATS micro
// service SubmitServiceName answers SubmitRequests on SubmitSubject, in a
// queue group, so any gateway replica may take a request.
//
// Framing. A caller publishes one SubmitRequest with a reply subject. The
// gateway answers on that subject; every answer carries HeaderStatus:
//
//   - StatusChunk: the body is a SubmitChunk, a piece of the committed
//     stream. Only for request.stream = true; Seq counts from 1 without gaps,
//     so a lost chunk is seen.
//   - StatusDone: the final message of a success; the body is the
//     SubmitResponse. For a stream its Content and ToolCalls are empty: the
//     chunks carried them.
//   - StatusError: the final message of a failure. It carries the NATS micro
//     error headers (Nats-Service-Error-Code, an HTTP-like status such as
//     "400" or "504", and Nats-Service-Error, the message), HeaderErrorCode
//     with the stable ErrorCode, HeaderGroup when a group ran, and the
//     SubmitError as its JSON body.
//
// A non-streaming request gets exactly one message (done or error); a
// stream gets its chunks and then one done or error. A stream that fails
// after chunks were sent ends with an error, never with another attempt's
// bytes.
//
// Cancelling. A caller that sets HeaderRequestID (a SubmitRequestID token)
// may cancel its request by publishing anything on
// SubmitCancelSubject(id): every replica listens there, and the one running
// the request cancels its group with no fallback. A cancel that overtakes its
// request is remembered for a while, so the request is cancelled on arrival.
// The gateway also notices a streaming caller that went away without a word:
// it publishes chunks with a reply subject of its own, so the NATS server's
// no-responders answer (the caller's reply subscription is gone) cancels the
// group.
const (
	SubmitServiceName = "hedgerow"
	SubmitSubject     = "hedgerow.submit"
	// SubmitCancelPrefix is followed by the request id (SubmitCancelSubject).
	SubmitCancelPrefix = "hedgerow.submit.cancel."

	// HeaderAuthorization carries the caller's API key as "Bearer <key>",
	// the HTTP door's header and form: a gateway with tenants configured
	// refuses a request without a key of theirs (unauthenticated, 401)
	// and counts it against the key's tenant.
	HeaderAuthorization = "Authorization"

	HeaderStatus    = "Hedgerow-Status"
	HeaderRequestID = "Hedgerow-Request-Id"
	HeaderErrorCode = "Hedgerow-Error-Code"
	HeaderGroup     = "Hedgerow-Group"
	// HeaderShouldRetry says on every error whether the same request sent
	// again may succeed ("true" or "false"), and HeaderRetryAfter, when
	// set, after how many whole seconds (the HTTP door's X-Should-Retry and
	// Retry-After).
	HeaderShouldRetry = "Hedgerow-Should-Retry"
	HeaderRetryAfter  = "Hedgerow-Retry-After"

	StatusChunk = "chunk"
	StatusDone  = "done"
	StatusError = "error"
)

// submitRequestID is the form of a request id: one NATS subject token.
var submitRequestID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidSubmitRequestID reports whether id may name a request: 1 to 64
// letters, digits, '_' or '-', so it is one subject token.
func ValidSubmitRequestID(id string) bool { return submitRequestID.MatchString(id) }

// SubmitCancelSubject is the subject that cancels the request with this id.
func SubmitCancelSubject(id string) string { return SubmitCancelPrefix + id }

// SubmitChunk is one piece of a committed stream on the caller's reply
// subject (HeaderStatus StatusChunk): the winner's content and tool-call
// deltas, in order. Seq counts from 1 without gaps.
type SubmitChunk struct {
	V     int    `json:"v"`
	Seq   int64  `json:"seq"`
	Delta string `json:"delta,omitempty"` // content text
	// ToolCalls holds tool-call deltas in the OpenAI shape, as the provider
	// sent them.
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

// Kind names the message's schema.
func (SubmitChunk) Kind() string { return KindSubmitChunk }

// MarshalJSON writes the message with its major version.
func (m SubmitChunk) MarshalJSON() ([]byte, error) {
	type wire SubmitChunk
	w := wire(m)
	w.V = stampVersion(m.V)
	return json.Marshal(w)
}
