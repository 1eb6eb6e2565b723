package schemas

import "encoding/json"

// SubmitRequest is a request to the hedgerow.submit NATS front door.
type SubmitRequest struct {
	V              int    `json:"v"`
	OperationClass string `json:"operation_class"`
	// ModelClass is the model the caller asks for: a pool's name or one of
	// the model names the pool answers to (docs/architecture.md §10).
	ModelClass string `json:"model_class"`
	// IdempotencyKey is the caller's id for the user action; retries of the
	// same action reuse it so they share one attempt ledger and winner gate.
	// The gateway never records it: it derives an opaque user action id with
	// UserActionID. Empty means a fresh user action.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// DeadlineMs is the caller's budget for the whole action, relative to
	// receipt so the two clocks need not agree; 0 means the policy default.
	DeadlineMs int64       `json:"deadline_ms,omitempty"`
	Request    ChatRequest `json:"request"`
}

// Kind names the message's schema.
func (SubmitRequest) Kind() string { return KindSubmitRequest }

// MarshalJSON writes the message with its major version.
func (m SubmitRequest) MarshalJSON() ([]byte, error) {
	type wire SubmitRequest
	w := wire(m)
	w.V = stampVersion(m.V)
	return json.Marshal(w)
}

// GateValue identifies the committed winner of a user action: the value the
// winner gate holds. Effect executors compare it with the one they were
// handed so they act only on the committed winner.
type GateValue struct {
	GroupID string `json:"group_id"`
	Attempt int    `json:"attempt"`
	Epoch   int64  `json:"epoch"`
}

// SubmitError is the one stable error a failed group returns.
type SubmitError struct {
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
	// Winner names the committed winner when Code is ErrAlreadyCommitted.
	Winner *GateValue `json:"winner,omitempty"`
}

// Error implements error so front doors and clients can return it as is.
func (e *SubmitError) Error() string { return string(e.Code) + ": " + e.Message }

// SubmitResponse answers a SubmitRequest: the winner's answer, or Error.
type SubmitResponse struct {
	V            int    `json:"v"`
	UserActionID string `json:"user_action_id"`
	GroupID      string `json:"group_id"`
	// Content, ToolCalls and FinishReason are the winner's answer.
	Content      string          `json:"content,omitempty"`
	ToolCalls    json.RawMessage `json:"tool_calls,omitempty"`
	FinishReason string          `json:"finish_reason,omitempty"`
	// Usage is the winner's; TotalUsage adds every attempt, losers included.
	Usage         Usage        `json:"usage"`
	TotalUsage    Usage        `json:"total_usage"`
	Attempts      int          `json:"attempts"` // launched, primary included
	Hedged        bool         `json:"hedged"`
	WinnerAttempt int          `json:"winner_attempt,omitempty"`
	WinnerRoute   string       `json:"winner_route,omitempty"`
	Gate          *GateValue   `json:"gate,omitempty"`
	Error         *SubmitError `json:"error,omitempty"`
}

// Kind names the message's schema.
func (SubmitResponse) Kind() string { return KindSubmitResponse }

// MarshalJSON writes the message with its major version.
func (m SubmitResponse) MarshalJSON() ([]byte, error) {
	type wire SubmitResponse
	w := wire(m)
	w.V = stampVersion(m.V)
	return json.Marshal(w)
}
