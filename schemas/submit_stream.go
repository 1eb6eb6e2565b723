package schemas

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
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
// may cancel its request by publishing anything on the subject
// SubmitCancelSubjectFor(its reply inbox, id) — with its own HeaderAuthorization
// when tenants are configured: every replica listens there, and the one
// running the request cancels its group with no fallback and answers the
// caller a final error canceled. A cancel is honoured only from the
// request's owner (docs/architecture.md §8, "Cancels belong to their
// caller"): the same tenant key as the request; when the request's reply
// inbox is a client user's (ClientInboxPrefix.<user>.…), the subject
// SubmitCancelUserSubject(user, id), which NATS permissions let only that
// user publish; and with neither, an unguessable id
// (UnguessableSubmitRequestID). Ids are scoped per owner. A cancel that
// overtakes its request is remembered for a while, so the request is
// answered canceled on arrival.
// The gateway also notices a streaming caller that went away without a word:
// it publishes chunks with a reply subject of its own, so the NATS server's
// no-responders answer (the caller's reply subscription is gone) cancels the
// group.
const (
	SubmitServiceName = "hedgerow"
	SubmitSubject     = "hedgerow.submit"
	// SubmitCancelPrefix is followed by the request id
	// (SubmitCancelSubject), or by the caller's NATS user and the request
	// id (SubmitCancelUserSubject).
	SubmitCancelPrefix = "hedgerow.submit.cancel."
	// MinUnguessableRequestIDLen is the length from which a request id
	// counts as unguessable (UnguessableSubmitRequestID): 32 characters
	// hold 128 bits as hex, the sparsest encoding in use; a caller draws
	// them at random (crypto/rand), the gateway checks only the length.
	MinUnguessableRequestIDLen = 32

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
	// HeaderRegion names, on a committed_in_region error, the region that
	// committed the user action, where a retry is answered (the HTTP
	// door's X-Hedgerow-Region; docs/architecture.md §14).
	HeaderRegion = "Hedgerow-Region"

	StatusChunk = "chunk"
	StatusDone  = "done"
	StatusError = "error"
)

// submitRequestID is the form of a request id: one NATS subject token.
var submitRequestID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidSubmitRequestID reports whether id may name a request: 1 to 64
// letters, digits, '_' or '-', so it is one subject token.
func ValidSubmitRequestID(id string) bool { return submitRequestID.MatchString(id) }

// UnguessableSubmitRequestID reports whether id is long enough to be the
// only proof that a cancel comes from the request's owner: a valid id of at
// least MinUnguessableRequestIDLen characters.
func UnguessableSubmitRequestID(id string) bool {
	return len(id) >= MinUnguessableRequestIDLen && ValidSubmitRequestID(id)
}

// clientUser is the form of a client user's name in its inbox prefix, the
// user names `hedgerow nats-auth` generates.
var clientUser = regexp.MustCompile(`^[a-z0-9_-]+$`)

// ClientInboxUser returns the client user whose inbox subject is under,
// ClientInboxPrefix.<user>.<more tokens>; false when subject is under no
// client user's inbox.
func ClientInboxUser(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, ClientInboxPrefix+".")
	if !ok {
		return "", false
	}
	user, tail, ok := strings.Cut(rest, ".")
	if !ok || tail == "" || !clientUser.MatchString(user) {
		return "", false
	}
	return user, true
}

// SubmitCancelSubject is the subject that cancels the request with this id
// of a caller whose reply inbox is no client user's.
func SubmitCancelSubject(id string) string { return SubmitCancelPrefix + id }

// SubmitCancelUserPrefix is followed by the request ids of user's cancels:
// the only cancel subjects the generated permissions let user publish.
func SubmitCancelUserPrefix(user string) string { return SubmitCancelPrefix + user + "." }

// SubmitCancelUserSubject is the subject that cancels the request with this
// id of a caller whose reply inbox is client user's.
func SubmitCancelUserSubject(user, id string) string { return SubmitCancelUserPrefix(user) + id }

// SubmitCancelSubjectFor is the subject that cancels the request with this
// id sent with reply inbox inbox (any inbox of the caller's connection: they
// share its prefix).
func SubmitCancelSubjectFor(inbox, id string) string {
	if user, ok := ClientInboxUser(inbox); ok {
		return SubmitCancelUserSubject(user, id)
	}
	return SubmitCancelSubject(id)
}

// ErrMalformedCancel is the error of a subject that is no cancel subject.
var ErrMalformedCancel = errors.New("schemas: not a cancel subject: want " + SubmitCancelPrefix + "[<user>.]<request id>")

// ParseSubmitCancelSubject reads a cancel subject: the client user it names
// (empty for SubmitCancelSubject's form) and the request id. A subject of
// another form is ErrMalformedCancel.
func ParseSubmitCancelSubject(subject string) (user, id string, err error) {
	return parseSubmitCancel(SubmitCancelPrefix, subject)
}

// parseSubmitCancel reads a cancel subject under prefix (a Wire's
// SubmitCancelPrefix).
func parseSubmitCancel(prefix, subject string) (user, id string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", "", ErrMalformedCancel
	}
	user, id, two := strings.Cut(rest, ".")
	if !two {
		user, id = "", rest
	} else if !clientUser.MatchString(user) {
		return "", "", ErrMalformedCancel
	}
	if !ValidSubmitRequestID(id) {
		return "", "", ErrMalformedCancel
	}
	return user, id, nil
}

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
