package arbiter

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hedgerow/hedgerow/schemas"
)

// Observation is what the dispatcher knows of one attempt when it asks for a
// verdict: after each progress event while streaming, and once the result
// has arrived.
type Observation struct {
	// Status is the attempt's status class: empty while a stream is running
	// and no failure has been reported, StatusOK once the upstream answered
	// successfully, another class once it failed.
	Status schemas.StatusClass
	// WellFormed reports that every chunk so far arrived in sequence and
	// parsed. It must be set explicitly: the zero value is a malformed
	// stream, so a forgotten field fails closed.
	WellFormed bool
	// Tokens is the number of output tokens received so far; once Done, the
	// larger of the counted tokens and the provider's reported output.
	Tokens int
	// FirstToken reports that a content or tool-call token has arrived;
	// role-only and empty deltas do not count.
	FirstToken bool
	// Done reports that the attempt's result has arrived.
	Done bool
	// FinishReason is the provider's finish reason; set when Done.
	FinishReason string
	// Content is the answer the contract judges, set when Done: the message
	// text, or the tool-call arguments for a tool-calling contract.
	Content []byte
	// Refusal reports that the answer carries a model's refusal (OpenAI's
	// refusal field), which counts as an answer: it is not empty.
	Refusal bool
	// MaxTokens is the output limit the caller asked for; zero when none.
	// An answer ended by "length" with fewer tokens was cut short of it.
	MaxTokens int
}

// Verdict is the arbiter's judgement of an Observation.
type Verdict struct {
	// Valid reports that the attempt may be elected; it implies Ready.
	Valid bool
	// Ready reports that the verdict is final: either the commit point has
	// been reached, or the attempt has already failed in a way no later
	// output can repair (an error status, a malformed stream, an early
	// incomplete finish). Ready && !Valid means the attempt can never win.
	// !Ready means wait for more output.
	Ready bool
	// Reason says why the attempt is not valid or not ready. It is built
	// only from status classes, known finish reasons, configured field
	// names and schema locations — never from the attempt's content — so
	// it may be logged and recorded.
	Reason string
}

func valid() Verdict                 { return Verdict{Valid: true, Ready: true} }
func invalid(reason string) Verdict  { return Verdict{Ready: true, Reason: reason} }
func notReady(reason string) Verdict { return Verdict{Reason: reason} }

// Validate judges an attempt against a contract at a commit point (docs/architecture.md §4
// rule 3, §6). A nil contract is the empty contract. The commit point is the
// one chosen for the request (see Contract.CommitPoint); if the contract
// needs the whole answer, Validate judges at complete whatever point is
// passed, so a wrongly resolved point cannot let a partial answer win.
//
// At first_token an attempt is valid once its well-formed stream has
// produced a content or tool-call token; at tokens:N once it has produced N
// tokens. At either point an attempt that is done before reaching the point
// is valid only if it passes the success predicate and finished completely
// (or at a limit the predicate accepts). At complete the attempt must be
// done with status ok, pass the success predicate (see Contract.usable), a
// complete finish reason when the contract requires one, and content that
// is a JSON object with the required fields and satisfies the schema, when
// the contract has them. A malformed, empty, truncated, filtered, incomplete
// or schema-failing answer is never valid, unless the contract allows it.
//
// What a streaming commit point cannot see yet (truncation, the filter) is
// judged when the result arrives: a committed stream whose result fails it
// ends with an error (docs/architecture.md §4 rule 3).
func Validate(contract *Contract, point schemas.CommitPoint, obs Observation) Verdict {
	point = resolvePoint(contract, point)

	if obs.Status != "" && obs.Status != schemas.StatusOK {
		return invalid("attempt status " + statusName(obs.Status))
	}
	if obs.Done && obs.Status != schemas.StatusOK {
		return invalid("attempt done without status ok")
	}
	if !obs.WellFormed {
		return invalid("stream malformed")
	}

	switch point.Kind {
	case schemas.CommitFirstToken:
		if obs.FirstToken {
			return valid()
		}
		return beforePoint(contract, obs, "no content or tool-call token yet")
	case schemas.CommitTokens:
		if obs.Tokens >= point.Tokens {
			return valid()
		}
		return beforePoint(contract, obs, fmt.Sprintf("%d of %d tokens", max(obs.Tokens, 0), point.Tokens))
	default:
		return atComplete(contract, obs)
	}
}

// resolvePoint normalises a commit point as Contract.CommitPoint does for a
// streaming request; Validate itself never learns whether the request
// streams, so non-streaming requests rely on the caller passing complete.
func resolvePoint(contract *Contract, point schemas.CommitPoint) schemas.CommitPoint {
	return contract.CommitPoint(point, true)
}

// beforePoint judges an attempt that has not reached a streaming commit
// point: still running means wait; done means it ended early, which is only
// acceptable for a usable answer the model finished on its own (e.g. an
// answer shorter than tokens:N) or that stopped at a limit the predicate
// accepts (the caller's max_tokens below N).
func beforePoint(contract *Contract, obs Observation, waiting string) Verdict {
	if !obs.Done {
		return notReady(waiting)
	}
	if reason, ok := contract.usable(obs); !ok {
		return invalid(reason)
	}
	if CompleteFinish(obs.FinishReason) || truncatedFinish[obs.FinishReason] || filteredFinish[obs.FinishReason] {
		return valid()
	}
	return invalid("ended before the commit point with finish reason " + finishName(obs.FinishReason))
}

// usable is the default success predicate (docs/architecture.md §6), which
// every contract applies to a finished answer unless it allows otherwise:
//   - not ended by a content filter ("content_filter", "refusal");
//   - not truncated below its limit: an answer ended by "length" or
//     "max_tokens" must have reached the max_tokens the caller asked for,
//     or, when none was asked, the pool's MaxOutputTokens; with neither
//     known it counts as truncated;
//   - not empty: content that is not all white space, a tool call or a
//     refusal.
//
// The reason names only finish reasons and counts, never content.
func (c *Contract) usable(obs Observation) (reason string, ok bool) {
	var allowEmpty, allowTruncated, allowFilter bool
	maxOutput := 0
	if c != nil {
		allowEmpty, allowTruncated, allowFilter = c.allowEmpty, c.allowTruncated, c.allowContentFilter
		maxOutput = c.maxOutputTokens
	}
	if filteredFinish[obs.FinishReason] && !allowFilter {
		return "answer ended by the content filter (finish reason " + obs.FinishReason + ")", false
	}
	if truncatedFinish[obs.FinishReason] && !allowTruncated {
		limit, whose := obs.MaxTokens, "asked"
		if limit <= 0 {
			limit, whose = maxOutput, "route limit"
		}
		switch {
		case limit <= 0:
			return "answer truncated (finish reason " + obs.FinishReason + ") with no max_tokens asked and no route limit known", false
		case obs.Tokens < limit:
			return fmt.Sprintf("answer truncated at %d of %d tokens (%s)", max(obs.Tokens, 0), limit, whose), false
		}
	}
	if !allowEmpty && !obs.Refusal && len(bytes.TrimSpace(obs.Content)) == 0 {
		return "empty answer: no content, tool call or refusal", false
	}
	return "", true
}

func atComplete(contract *Contract, obs Observation) Verdict {
	if !obs.Done {
		return notReady("answer not complete yet")
	}
	if reason, ok := contract.usable(obs); !ok {
		return invalid(reason)
	}
	if contract.RequireComplete() && !CompleteFinish(obs.FinishReason) {
		return invalid("incomplete answer: finish reason " + finishName(obs.FinishReason))
	}
	if contract == nil || (len(contract.requiredFields) == 0 && contract.schema == nil) {
		return valid()
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(obs.Content))
	if err != nil {
		// The decoder's error can quote the offending bytes: not echoed.
		return invalid("content is not valid JSON")
	}
	if len(contract.requiredFields) > 0 {
		obj, ok := doc.(map[string]any)
		if !ok {
			return invalid("content is not a JSON object")
		}
		for _, f := range contract.requiredFields {
			if _, ok := obj[f]; !ok {
				return invalid(fmt.Sprintf("content lacks required field %q", f))
			}
		}
	}
	if contract.schema != nil {
		if err := contract.schema.Validate(doc); err != nil {
			return invalid("content fails JSON schema at " + schemaLocation(err))
		}
	}
	return valid()
}

// schemaLocation names where in the schema the first failing keyword sits,
// e.g. "#/properties/age/minimum". The validator's own messages can quote
// instance values and its instance locations can carry keys taken from the
// content, so only the schema side is reported.
func schemaLocation(err error) string {
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return "#"
	}
	for len(verr.Causes) > 0 {
		verr = verr.Causes[0]
	}
	loc := "#"
	if i := strings.IndexByte(verr.SchemaURL, '#'); i >= 0 {
		loc = verr.SchemaURL[i:]
	}
	if verr.ErrorKind != nil {
		for _, kw := range verr.ErrorKind.KeywordPath() {
			loc += "/" + kw
		}
	}
	return loc
}

// knownStatus lists the status classes that may be named in a reason; any
// other value is reported generically rather than echoed.
var knownStatus = map[schemas.StatusClass]bool{
	schemas.StatusOK: true, schemas.StatusInvalidRequest: true, schemas.StatusAuth: true,
	schemas.StatusNotFound: true, schemas.StatusRateLimited: true, schemas.StatusOverloaded: true,
	schemas.StatusServerError: true, schemas.StatusTimeout: true, schemas.StatusCanceled: true,
	schemas.StatusContractInvalid: true, schemas.StatusBusy: true, schemas.StatusNoResponders: true,
	schemas.StatusLost: true,
}

func statusName(s schemas.StatusClass) string {
	if knownStatus[s] {
		return string(s)
	}
	return "unknown"
}

func finishName(reason string) string {
	switch {
	case reason == "":
		return "missing"
	case completeFinish[reason], knownIncompleteFinish[reason]:
		return reason
	default:
		return "unknown"
	}
}
