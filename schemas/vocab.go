// Package schemas holds the wire and record types that hedgerow's processes
// exchange over NATS and publish as sanitized records, together with the JSON
// Schema files that define them. It is the bottom of the dependency graph:
// every other package may import it; it imports none of them.
package schemas

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors of the package, which callers may branch on with errors.Is.
var (
	// ErrUnknownKind is returned by Validate for a kind with no schema.
	ErrUnknownKind = errors.New("schemas: unknown schema kind")

	// A malformed request and an unsupported version reach a caller of the
	// NATS front door inside its invalid_request message, so their texts
	// stay as callers know them, without the package's prefix.

	// ErrMalformedRequest is matched by every error ChatRequest.Validate
	// returns; front doors map it to the caller-facing ErrorCode
	// ErrInvalidRequest.
	ErrMalformedRequest = errors.New("malformed request")
	// ErrUnsupportedVersion is matched (errors.Is) by every error
	// reporting a message whose major version this binary does not speak.
	ErrUnsupportedVersion = errors.New("unsupported major version")
)

// Role says why an attempt was launched.
type Role string

const (
	// RolePrimary is the first attempt of a hedge group.
	RolePrimary Role = "primary"
	// RoleHedge is a duplicate launched while an earlier attempt is still running.
	RoleHedge Role = "hedge"
	// RoleReplacement is launched at once after a transient failure of an attempt.
	RoleReplacement Role = "replacement"
	// RoleContinuation continues a committed stream that broke after its
	// commit from the text the caller already received (issue 30): its
	// attempt carries a Continuation, and its output follows that text.
	RoleContinuation Role = "continuation"
)

// ErrorScope says how far a failure reaches; the hedge engine acts on the scope,
// never on the order in which failures arrive (docs/architecture.md §4 rule 4).
type ErrorScope string

const (
	// ScopeNone marks a result that is not a failure.
	ScopeNone ErrorScope = "none"
	// ScopeGroup is a permanent failure of the shared request (invalid request,
	// context too long, input policy): it ends the whole group.
	ScopeGroup ErrorScope = "group"
	// ScopeRoute is a permanent failure local to one route (auth, missing model,
	// bad route config): the route is quarantined, only that attempt ends.
	ScopeRoute ErrorScope = "route"
	// ScopeTransient is a failure of one attempt that another attempt may not
	// share (5xx, timeout, reset, busy, lost heartbeats, invalid output).
	ScopeTransient ErrorScope = "transient"
	// ScopePushback is a provider asking for less load (429 with Retry-After,
	// 529 overloaded): the route is paused and no hedge is sent towards it.
	ScopePushback ErrorScope = "pushback"
)

// StatusClass is the coarse, sanitized class of an attempt's outcome.
type StatusClass string

const (
	StatusOK              StatusClass = "ok"
	StatusInvalidRequest  StatusClass = "invalid_request"
	StatusAuth            StatusClass = "auth"
	StatusNotFound        StatusClass = "not_found"
	StatusRateLimited     StatusClass = "rate_limited"
	StatusOverloaded      StatusClass = "overloaded"
	StatusServerError     StatusClass = "server_error"
	StatusTimeout         StatusClass = "timeout"
	StatusCanceled        StatusClass = "canceled"
	StatusContractInvalid StatusClass = "contract_invalid"
	StatusBusy            StatusClass = "busy"
	StatusNoResponders    StatusClass = "no_responders"
	StatusLost            StatusClass = "lost" // no accept, heartbeats stopped, or a chunk gap
)

// ErrorCode is a stable error returned to the caller when a group fails.
type ErrorCode string

const (
	ErrDeadlineExceeded ErrorCode = "deadline_exceeded"
	ErrAlreadyCommitted ErrorCode = "already_committed"
	ErrInvalidRequest   ErrorCode = "invalid_request"
	ErrRouteFailed      ErrorCode = "route_failed"      // a route-local permanent failure with no route left
	ErrAllRoutesFailed  ErrorCode = "all_routes_failed" // every attempt failed transiently, none left to try
	ErrNoRoute          ErrorCode = "no_route"          // admission found no healthy route
	// ErrNoWorkers: every attempt of the group found no worker on its
	// route (NATS no responders, re-offers included): the pool has no live
	// worker now, while other pools may answer (docs/architecture.md §4
	// rule 4).
	ErrNoWorkers       ErrorCode = "no_workers"
	ErrBudgetExhausted ErrorCode = "budget_exhausted" // the attempt ledger or spend ceiling refused the primary
	ErrRateLimited     ErrorCode = "rate_limited"     // every route pushed back
	ErrOverloaded      ErrorCode = "overloaded"       // the pool's workers stayed full for the whole queue wait (§4 rule 4)
	ErrCanceled        ErrorCode = "canceled"         // the caller went away
	// ErrStreamInterrupted: a committed stream's winner failed, stalled or
	// went silent after its first bytes, so the caller holds a prefix and
	// an error event; nothing of the user action counts as delivered and a
	// retry with the same idempotency key commits anew (docs/architecture.md
	// §6, "A commit that was never delivered").
	ErrStreamInterrupted ErrorCode = "stream_interrupted"
	// ErrGateUnavailable: the winner gate could not decide and was told
	// not to decide alone (docs/architecture.md §6); nothing committed, a
	// retry may.
	ErrGateUnavailable ErrorCode = "gate_unavailable"
	// Codes of the hedgerow.submit front door only, for failures before any
	// group runs; never in a group record.
	ErrUnknownModel ErrorCode = "unknown_model" // model_class names no pool
	ErrUnavailable  ErrorCode = "unavailable"   // this replica cannot take the request now: retry
	// ErrUnauthenticated: tenants are configured and the request carried
	// no key of theirs (header Authorization: Bearer <key>).
	ErrUnauthenticated ErrorCode = "unauthenticated"
	// ErrTenantRateLimited and ErrTenantConcurrencyLimited: the caller's
	// tenant is over its request rate or its requests in flight; retry
	// after the Retry-After hint (docs/architecture.md §2).
	ErrTenantRateLimited        ErrorCode = "tenant_rate_limited"
	ErrTenantConcurrencyLimited ErrorCode = "tenant_concurrency_limited"
	// ErrAnswerNotKept: the request of this idempotency key was answered
	// and its answer delivered whole, but it was too large for the replay
	// store, so it cannot be sent again; nothing is run again either
	// (docs/architecture.md §2).
	ErrAnswerNotKept ErrorCode = "answer_not_kept"
	// ErrCommittedInRegion: the request of this idempotency key was
	// committed in another region (HeaderRegion names it), whose answer is
	// not kept here; a retry there is answered, and one here runs again
	// only once that region has been unheard for global.rerun_after
	// (docs/architecture.md §14, "User actions across regions").
	ErrCommittedInRegion ErrorCode = "committed_in_region"
)

// Usage is the work an attempt consumed, in provider usage units (tokens).
// Estimated is set when the figure is not the provider's own report, e.g. a
// cancelled attempt settled at its elapsed decode time (docs/architecture.md §7).
type Usage struct {
	InputUnits  int64 `json:"input_units"`
	OutputUnits int64 `json:"output_units"`
	Estimated   bool  `json:"estimated,omitempty"`
}

// Add returns the sum of two usages; the sum is estimated if either part is.
func (u Usage) Add(o Usage) Usage {
	return Usage{
		InputUnits:  u.InputUnits + o.InputUnits,
		OutputUnits: u.OutputUnits + o.OutputUnits,
		Estimated:   u.Estimated || o.Estimated,
	}
}

// CommitKind names where in an attempt's output a winner may be elected.
type CommitKind string

const (
	// CommitFirstToken elects at the first content or tool-call token of a
	// well-formed stream: the default for streaming requests.
	CommitFirstToken CommitKind = "first_token"
	// CommitTokens elects once N output tokens have arrived.
	CommitTokens CommitKind = "tokens"
	// CommitComplete elects only on a complete, validated answer: always used
	// for non-streaming requests and for contracts that need the whole answer.
	CommitComplete CommitKind = "complete"
)

// CommitPoint is a CommitKind with its token count; its text form is
// "first_token", "tokens:N" or "complete".
type CommitPoint struct {
	Kind   CommitKind
	Tokens int // only for CommitTokens, ≥ 1
}

// Commit points without parameters.
var (
	FirstToken = CommitPoint{Kind: CommitFirstToken}
	Complete   = CommitPoint{Kind: CommitComplete}
)

// ParseCommitPoint parses the text form of a commit point.
func ParseCommitPoint(s string) (CommitPoint, error) {
	switch {
	case s == string(CommitFirstToken):
		return FirstToken, nil
	case s == string(CommitComplete):
		return Complete, nil
	case strings.HasPrefix(s, "tokens:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "tokens:"))
		if err != nil || n < 1 {
			return CommitPoint{}, fmt.Errorf("commit point %q: token count must be a positive integer", s)
		}
		return CommitPoint{Kind: CommitTokens, Tokens: n}, nil
	}
	return CommitPoint{}, fmt.Errorf("commit point %q: want first_token, tokens:N or complete", s)
}

func (c CommitPoint) String() string {
	if c.Kind == CommitTokens {
		return "tokens:" + strconv.Itoa(c.Tokens)
	}
	return string(c.Kind)
}

// MarshalText implements encoding.TextMarshaler.
func (c CommitPoint) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *CommitPoint) UnmarshalText(b []byte) error {
	p, err := ParseCommitPoint(string(b))
	if err != nil {
		return err
	}
	*c = p
	return nil
}
