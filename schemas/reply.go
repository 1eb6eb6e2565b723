package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// ReplyType discriminates the messages a worker sends on an attempt's reply
// inbox, which all share one subject. It is written as the "type" field by
// each reply's MarshalJSON and read by DecodeReply.
type ReplyType string

// The reply types, one per reply-inbox message.
const (
	ReplyAccept    ReplyType = "accept"
	ReplyBusy      ReplyType = "busy"
	ReplyHeartbeat ReplyType = "heartbeat"
	ReplyFirstByte ReplyType = "first_byte"
	ReplyChunk     ReplyType = "chunk"
	ReplyResult    ReplyType = "result"
)

// Reply is one message on an attempt's reply inbox: *Accept, *Busy,
// *Heartbeat, *FirstByte, *Chunk or *AttemptResult.
type Reply interface {
	// ReplyType is the message's "type" on the wire.
	ReplyType() ReplyType
	// AttemptRef names the group and attempt the message belongs to.
	AttemptRef() (groupID string, attempt int)
	// Sender names the worker that sent the message and the attempt's
	// secret it returned (Attempt.Secret); workerID is empty in messages
	// of workers that predate it.
	Sender() (workerID, secret string)
}

// Accept says a worker took the attempt; cancels go to ControlInbox.
type Accept struct {
	V            int    `json:"v"`
	GroupID      string `json:"group_id"`
	Attempt      int    `json:"attempt"`
	WorkerID     string `json:"worker_id"`
	ControlInbox string `json:"control_inbox"`
	Secret       string `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// Busy says the worker is at its in-flight limit and did not take the
// attempt: a transient, route-local failure of that attempt.
type Busy struct {
	V        int    `json:"v"`
	GroupID  string `json:"group_id"`
	Attempt  int    `json:"attempt"`
	WorkerID string `json:"worker_id"`
	Secret   string `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// Heartbeat says an accepted attempt is alive and still waiting for its
// first byte. Seq counts heartbeats from 1.
type Heartbeat struct {
	V        int    `json:"v"`
	GroupID  string `json:"group_id"`
	Attempt  int    `json:"attempt"`
	Seq      int64  `json:"seq"`
	WorkerID string `json:"worker_id,omitempty"`
	Secret   string `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// FirstByte says the model has produced its first token of any kind (text,
// a tool call, a refusal, reasoning): the moment the first_byte hedge
// trigger measures. A stream the provider opened without a token (headers,
// a role-only chunk, keep-alives) is not a first byte. It is sent at most
// once, ends the heartbeats and precedes every Chunk.
// ElapsedMs is measured by the worker from the attempt's arrival.
type FirstByte struct {
	V         int    `json:"v"`
	GroupID   string `json:"group_id"`
	Attempt   int    `json:"attempt"`
	ElapsedMs int64  `json:"elapsed_ms"`
	WorkerID  string `json:"worker_id,omitempty"`
	Secret    string `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// Chunk carries coalesced output of a streaming attempt. Seq counts chunks
// from 1 without gaps; a gap fails the attempt. First marks the chunk holding
// the first content or tool-call token (the first_token commit point).
type Chunk struct {
	V       int    `json:"v"`
	GroupID string `json:"group_id"`
	Attempt int    `json:"attempt"`
	Seq     int64  `json:"seq"`
	Delta   string `json:"delta,omitempty"` // content text
	// ToolCalls holds the provider's tool-call deltas in the OpenAI shape
	// (an array of {index, id, type, function:{name, arguments}} fragments).
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	Tokens           int64           `json:"tokens"`            // output tokens in this chunk
	CumulativeTokens int64           `json:"cumulative_tokens"` // output tokens so far, this chunk included
	First            bool            `json:"first,omitempty"`
	WorkerID         string          `json:"worker_id,omitempty"`
	Secret           string          `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// AttemptResult ends an attempt: how it ended, what it produced (in full for
// non-streaming requests) and what it consumed. A cancelled attempt still
// sends one, with the usage it observed.
type AttemptResult struct {
	V           int         `json:"v"`
	GroupID     string      `json:"group_id"`
	Attempt     int         `json:"attempt"`
	WorkerID    string      `json:"worker_id"`
	StatusClass StatusClass `json:"status_class"`
	ErrorScope  ErrorScope  `json:"error_scope"`
	// HTTPStatus is the provider's status; 0 when no response arrived.
	HTTPStatus   int    `json:"http_status,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	FinishReason string `json:"finish_reason,omitempty"`
	// Content and ToolCalls hold the whole answer of a non-streaming request;
	// a streaming attempt delivers them as chunks instead.
	Content   string          `json:"content,omitempty"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	// Refusal is a model's refusal (OpenAI's refusal field), streaming or
	// not: it is never sent as a chunk. A refusal is an answer to the
	// success predicate (docs/architecture.md §6), not an empty one.
	Refusal string `json:"refusal,omitempty"`
	// Embeddings holds the vectors of an embeddings request: the array of
	// OpenAI embedding objects ({"object":"embedding","index":i,
	// "embedding":[...] or "<base64>"}), one per input, in input order.
	Embeddings json.RawMessage `json:"embeddings,omitempty"`
	// LastSeq is the Seq of the last chunk sent (0 if none), so a lost
	// trailing chunk is detected as a gap.
	LastSeq              int64  `json:"last_seq"`
	Usage                Usage  `json:"usage"`
	FirstByteMs          *int64 `json:"first_byte_ms,omitempty"` // absent: no first byte
	ElapsedMs            int64  `json:"elapsed_ms"`
	CancellationObserved bool   `json:"cancellation_observed"`
	// MaxTokenGapMs is the longest wait between two consecutive tokens of
	// the provider's stream after the first, in milliseconds rounded up;
	// absent when fewer than two tokens came (or from a worker that does
	// not measure it). The dispatcher derives its cohort's stall bound from
	// those of successful attempts (docs/architecture.md §4 rule 4).
	MaxTokenGapMs int64 `json:"max_token_gap_ms,omitempty"`
	// ErrorMessage is a sanitized, bounded description (see SanitizeMessage);
	// never a raw provider body, which can echo prompts or credentials.
	ErrorMessage string `json:"error_message,omitempty"`
	Secret       string `json:"secret,omitempty"` // the attempt's (Attempt.Secret)
}

// ReplyType implements Reply.
func (*Accept) ReplyType() ReplyType { return ReplyAccept }

// ReplyType implements Reply.
func (*Busy) ReplyType() ReplyType { return ReplyBusy }

// ReplyType implements Reply.
func (*Heartbeat) ReplyType() ReplyType { return ReplyHeartbeat }

// ReplyType implements Reply.
func (*FirstByte) ReplyType() ReplyType { return ReplyFirstByte }

// ReplyType implements Reply.
func (*Chunk) ReplyType() ReplyType { return ReplyChunk }

// ReplyType implements Reply.
func (*AttemptResult) ReplyType() ReplyType { return ReplyResult }

// AttemptRef implements Reply.
func (m *Accept) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// AttemptRef implements Reply.
func (m *Busy) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// AttemptRef implements Reply.
func (m *Heartbeat) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// AttemptRef implements Reply.
func (m *FirstByte) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// AttemptRef implements Reply.
func (m *Chunk) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// AttemptRef implements Reply.
func (m *AttemptResult) AttemptRef() (string, int) { return m.GroupID, m.Attempt }

// Sender implements Reply.
func (m *Accept) Sender() (string, string) { return m.WorkerID, m.Secret }

// Sender implements Reply.
func (m *Busy) Sender() (string, string) { return m.WorkerID, m.Secret }

// Sender implements Reply.
func (m *Heartbeat) Sender() (string, string) { return m.WorkerID, m.Secret }

// Sender implements Reply.
func (m *FirstByte) Sender() (string, string) { return m.WorkerID, m.Secret }

// Sender implements Reply.
func (m *Chunk) Sender() (string, string) { return m.WorkerID, m.Secret }

// Sender implements Reply.
func (m *AttemptResult) Sender() (string, string) { return m.WorkerID, m.Secret }

// Kind names the message's schema.
func (Accept) Kind() string { return KindAccept }

// Kind names the message's schema.
func (Busy) Kind() string { return KindBusy }

// Kind names the message's schema.
func (Heartbeat) Kind() string { return KindHeartbeat }

// Kind names the message's schema.
func (FirstByte) Kind() string { return KindFirstByte }

// Kind names the message's schema.
func (Chunk) Kind() string { return KindChunk }

// Kind names the message's schema.
func (AttemptResult) Kind() string { return KindAttemptResult }

// The MarshalJSON methods below write "v" (see stampVersion) and the
// reply's "type" ahead of its fields; the outer fields shadow the
// embedded V.

// MarshalJSON writes the message with its version and type.
func (m Accept) MarshalJSON() ([]byte, error) {
	type wire Accept
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyAccept, wire(m)})
}

// MarshalJSON writes the message with its version and type.
func (m Busy) MarshalJSON() ([]byte, error) {
	type wire Busy
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyBusy, wire(m)})
}

// MarshalJSON writes the message with its version and type.
func (m Heartbeat) MarshalJSON() ([]byte, error) {
	type wire Heartbeat
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyHeartbeat, wire(m)})
}

// MarshalJSON writes the message with its version and type.
func (m FirstByte) MarshalJSON() ([]byte, error) {
	type wire FirstByte
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyFirstByte, wire(m)})
}

// MarshalJSON writes the message with its version and type.
func (m Chunk) MarshalJSON() ([]byte, error) {
	type wire Chunk
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyChunk, wire(m)})
}

// MarshalJSON writes the message with its version and type.
func (m AttemptResult) MarshalJSON() ([]byte, error) {
	type wire AttemptResult
	return json.Marshal(struct {
		V    int       `json:"v"`
		Type ReplyType `json:"type"`
		wire
	}{stampVersion(m.V), ReplyResult, wire(m)})
}

// DecodeReply decodes one reply-inbox message after checking its major
// version (see Decode) and dispatching on its "type". A message whose top
// level plainly says "v":1 and its type (see peekHead) is decoded in one
// pass (see decodeFlat), or by one json.Unmarshal if that pass declines it;
// any other goes the careful way. Results and errors are the same either way.
func DecodeReply(data []byte) (Reply, error) {
	if typ, ok := peekHead(data); ok {
		if r := newReply(string(typ)); r != nil {
			if decodeFlat(data, r) {
				return r, nil
			}
			// Declined: r may hold part of data; decode into a new one.
			if r = newReply(string(typ)); json.Unmarshal(data, r) == nil {
				return r, nil
			}
		}
	}
	return decodeReplyCarefully(data)
}

// newReply returns a new message of the reply type typ; nil for an unknown
// type.
func newReply(typ string) Reply {
	switch ReplyType(typ) {
	case ReplyAccept:
		return new(Accept)
	case ReplyBusy:
		return new(Busy)
	case ReplyHeartbeat:
		return new(Heartbeat)
	case ReplyFirstByte:
		return new(FirstByte)
	case ReplyChunk:
		return new(Chunk)
	case ReplyResult:
		return new(AttemptResult)
	}
	return nil
}

// decodeReplyCarefully is DecodeReply without the fast path: the version,
// the type and the message, each a pass of its own.
func decodeReplyCarefully(data []byte) (Reply, error) {
	if err := checkVersion(data); err != nil {
		return nil, err
	}
	var head struct {
		Type ReplyType `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	r := newReply(string(head.Type))
	if r == nil {
		return nil, fmt.Errorf("decode reply: unknown type %q", head.Type)
	}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("decode reply %s: %w", head.Type, err)
	}
	return r, nil
}

// HasToolCalls reports whether raw, the tool_calls member of a reply, a
// chunk or an answer (an array in the OpenAI shape), holds any: absent,
// JSON null and an empty array hold none.
func HasToolCalls(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(t, []byte("[]"))
}
