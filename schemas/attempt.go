package schemas

import (
	"encoding/json"
	"time"
)

// Attempt asks a worker to run one attempt of a hedge group. The dispatcher
// publishes it on hedgerow.attempt.<route>; the worker answers on ReplyInbox
// with Accept or Busy, then heartbeats, FirstByte, chunks and one AttemptResult.
type Attempt struct {
	V       int    `json:"v"`
	GroupID string `json:"group_id"`
	// UserActionID is the opaque id of the user action the group serves; see
	// UserActionID for how it is derived.
	UserActionID   string `json:"user_action_id"`
	Attempt        int    `json:"attempt"` // 1-based within the group
	Role           Role   `json:"role"`
	Route          string `json:"route"`
	OperationClass string `json:"operation_class"`
	ModelClass     string `json:"model_class"`
	// DeadlineUnixMs is the user action's absolute deadline. RemainingMs is
	// the budget left when the attempt was sent; a worker stops at whichever
	// comes first (see EffectiveDeadline), so a clock running behind the
	// dispatcher's cannot extend the deadline.
	DeadlineUnixMs int64       `json:"deadline_unix_ms"`
	RemainingMs    int64       `json:"remaining_ms"`
	CommitPoint    CommitPoint `json:"commit_point"`
	ReplyInbox     string      `json:"reply_inbox"`
	// Secret is this attempt's secret (NewAttemptSecret), which the worker
	// returns in every reply and the dispatcher puts in every Cancel, so
	// that neither side takes a message for the attempt from anyone who
	// has not seen the attempt (docs/architecture.md §8). Never logged,
	// recorded or counted. Additive in v1: a gateway that predates it
	// sends none, and a worker then echoes none.
	Secret  string      `json:"secret,omitempty"`
	Request ChatRequest `json:"request"`
	// StallAfterFirstTokenMs is the bound on the wait for each next token
	// once the first came, derived from the cohort's inter-token gaps
	// within the policy's stall_floor..stall_after_first_token
	// (docs/architecture.md §4 rule 4); 0 leaves the worker's own.
	// Additive in v1: an older worker ignores it.
	StallAfterFirstTokenMs int64 `json:"stall_after_first_token_ms,omitempty"`
	// Continuation, set on an attempt of role RoleContinuation, is the
	// partial answer the attempt continues from: the worker streams only
	// what follows it (docs/architecture.md §6, "Continuation attempts").
	// Additive in v1: a worker that predates it ignores it and answers the
	// whole request again, which would repeat the text the caller has, so
	// a dispatcher sends one only to a route whose configuration says it
	// can continue (routes[].continuation), whose workers read it (§8).
	Continuation *Continuation `json:"continuation,omitempty"`
	// FoldsFirstByte says the dispatcher takes a stream's first Chunk as
	// its first byte when no FirstByte came before it, and a result's
	// first_byte_ms likewise: a worker then sends no FirstByte of its own
	// right before the chunk that follows it anyway, one message fewer
	// per streamed attempt (docs/architecture.md §8). Additive in v1: an
	// older worker ignores it and sends FirstByte; an older dispatcher
	// does not send it, and is sent FirstByte.
	FoldsFirstByte bool `json:"folds_first_byte,omitempty"`
}

// EffectiveDeadline is the instant the worker must give up: the earlier of
// the absolute deadline and received + RemainingMs, where received is the
// worker's clock when the attempt arrived.
func (a Attempt) EffectiveDeadline(received time.Time) time.Time {
	abs := time.UnixMilli(a.DeadlineUnixMs)
	rel := received.Add(time.Duration(a.RemainingMs) * time.Millisecond)
	if rel.Before(abs) {
		return rel
	}
	return abs
}

// Kind names the attempt's schema.
func (Attempt) Kind() string { return KindAttempt }

// MarshalJSON writes the attempt with its major version.
func (a Attempt) MarshalJSON() ([]byte, error) {
	type wire Attempt
	w := wire(a)
	w.V = stampVersion(a.V)
	return json.Marshal(w)
}

// DecodeAttempt decodes an attempt message as Decode decodes one into a
// new Attempt: the same value, or the same error. A worker decodes every
// attempt it is sent, and encoding/json spends most of that on reflection
// and a validation pass of its own (issue 31), so a message whose top level
// plainly says "v":1 (see peekHead) is read in one pass (see decodeFlat);
// input that pass declines (escaped or case-folded keys, a member given
// twice, a value of the wrong type, an embeddings request, null array
// elements, ...) goes to encoding/json, and errors always come from it.
func DecodeAttempt(data []byte) (Attempt, error) {
	var a Attempt
	if _, ok := peekHead(data); ok {
		if decodeFlat(data, &a) {
			return a, nil
		}
		// Declined: a may hold part of data; decode into a new one.
		if a = (Attempt{}); json.Unmarshal(data, &a) == nil {
			return a, nil
		}
		a = Attempt{}
	}
	err := decodeCarefully(data, &a)
	return a, err
}

// CancelReason says why the dispatcher cancels an attempt. The values are
// those of the hedge engine's cancel reasons (dispatcher/hedge), so the
// runtime converts one to the other directly.
type CancelReason string

const (
	// CancelLostRace: another attempt of the group committed.
	CancelLostRace CancelReason = "lost_race"
	// CancelAlreadyCommitted: another group of the same user action won the gate.
	CancelAlreadyCommitted CancelReason = "already_committed"
	// CancelDeadline: the user action's deadline passed.
	CancelDeadline CancelReason = "deadline"
	// CancelCallerGone: the caller disconnected or gave up.
	CancelCallerGone CancelReason = "caller_gone"
	// CancelGroupError: a group-scoped permanent error ended the group.
	CancelGroupError CancelReason = "group_error"
	// CancelTimeout: the policy's per-try timeout passed, or the attempt went
	// silent (no accept, heartbeats lost).
	CancelTimeout CancelReason = "timeout"
	// CancelInvalid: the attempt's stream broke the contract (a chunk gap,
	// contract-invalid output).
	CancelInvalid CancelReason = "invalid"
)

// Cancel tells a worker, on the control inbox its Accept named, to stop an
// attempt and report what it had consumed.
type Cancel struct {
	V       int          `json:"v"`
	GroupID string       `json:"group_id"`
	Attempt int          `json:"attempt"`
	Reason  CancelReason `json:"reason"`
	// Secret is the attempt's secret (Attempt.Secret): a worker obeys a
	// cancel only when it matches (SameSecret).
	Secret string `json:"secret,omitempty"`
}

// Kind names the cancel's schema.
func (Cancel) Kind() string { return KindCancel }

// MarshalJSON writes the cancel with its major version.
func (c Cancel) MarshalJSON() ([]byte, error) {
	type wire Cancel
	w := wire(c)
	w.V = stampVersion(c.V)
	return json.Marshal(w)
}
