// Package arbiter decides which attempt of a user action may win: it judges
// an attempt's output against the request's contract at the commit point
// (Validate) and elects exactly one winner per user action through a gate
// (Gate): LocalGate within one dispatcher, and arbiter/sharedgate's
// RedisGate, which makes the election unique across the replicas that share
// one Redis.
package arbiter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hedgerow/hedgerow/schemas"
)

// Errors of the package, which callers may branch on with errors.Is.
var (
	// ErrInvalidClaim is returned for a claim without a user action or
	// group, or with a negative attempt number.
	ErrInvalidClaim = errors.New("arbiter: invalid gate claim")
	// ErrNotHolder is returned by Clear when the claim does not hold the
	// gate (it lost, was already cleared, or expired): compare-and-delete
	// removed nothing. Callers usually only record it.
	ErrNotHolder = errors.New("arbiter: claim does not hold the gate")
	// ErrGateDegraded is wrapped by the errors of sharedgate.RedisGate when Redis did
	// not answer in time or failed. Claim then still returns a usable
	// claim: the local compare-and-swap's decision, which is authoritative
	// for the groups of this dispatcher. A caller that gets an error
	// satisfying errors.Is(err, ErrGateDegraded) keeps that claim and
	// counts the election as degraded; only errors without it (an invalid
	// claim) leave no decision.
	ErrGateDegraded = errors.New("arbiter: redis gate degraded: local decision only")
	// ErrGateUnavailable is wrapped by the errors of a claim that no store
	// could decide and that the gate refuses rather than decide locally
	// (sharedgate.RedisGateOptions.OnUnavailable refuse, or fallback when the ledger
	// does not answer either). The Claim holds no decision: the group must
	// not commit.
	ErrGateUnavailable = errors.New("arbiter: winner gate unavailable")

	// The contract's errors reach a caller of the NATS front door inside
	// its invalid_request message, so their texts stay as callers know
	// them, without the package's prefix.

	// ErrInvalidContract is returned by NewContract when the contract
	// cannot be built: an empty required field name or a JSON schema that
	// does not compile.
	ErrInvalidContract = errors.New("arbiter: invalid contract")
	// ErrInvalidResponseFormat is returned by WithResponseFormat for a
	// response_format the contract cannot honour; callers answer 400.
	ErrInvalidResponseFormat = errors.New("arbiter: invalid response_format")
)

// contractSchemaURL names the contract's schema inside its private compiler.
// It is a URN, not a path, so no file or network location is ever consulted
// and none appears in validation reasons.
const contractSchemaURL = "urn:hedgerow:contract"

// ContractSpec is the configured form of a contract, as read from a pool's
// configuration. Its zero value is the default success predicate alone
// (docs/architecture.md §6): a finished answer wins only if it is not empty,
// not truncated below its limit and not ended by a content filter. The Allow
// fields relax that predicate; the other fields add to it.
type ContractSpec struct {
	// RequireComplete demands a complete finish reason (see CompleteFinish):
	// a truncated or filtered answer never wins, whatever the Allow fields.
	RequireComplete bool
	// AllowEmpty lets an answer without content, tool call or refusal win,
	// for pools whose callers expect nothing back.
	AllowEmpty bool
	// AllowTruncated lets an answer ended by an output limit ("length",
	// "max_tokens") win however short it is.
	AllowTruncated bool
	// AllowContentFilter lets an answer the provider's content filter ended
	// ("content_filter"; Anthropic's "refusal" stop reason, which the
	// adapter maps to it) win.
	AllowContentFilter bool
	// MaxOutputTokens is the most output tokens the pool's routes give an
	// answer when the request asks for no max_tokens: an answer ended by
	// "length" with at least this many tokens stopped at the route's own
	// limit and is whole as far as the route allows. Zero means unknown:
	// then every such answer counts as truncated. Set it to the smallest
	// default output limit among the pool's routes (for Anthropic routes,
	// the max_tokens the adapter sends, 4096 unless configured).
	MaxOutputTokens int
	// RequiredFields are top-level keys the answer's JSON content must have.
	RequiredFields []string
	// JSONSchema is the raw JSON Schema (draft 2020-12 unless it declares
	// $schema) that the answer's JSON content must satisfy; empty for none.
	JSONSchema []byte
}

// Contract is what a result must satisfy to be allowed to win. A nil
// *Contract is the zero ContractSpec's: the default success predicate alone.
// A Contract is immutable and safe for concurrent use.
type Contract struct {
	requireComplete    bool
	allowEmpty         bool
	allowTruncated     bool
	allowContentFilter bool
	maxOutputTokens    int
	requiredFields     []string
	schema             *jsonschema.Schema
}

// NewContract builds a contract from its spec, compiling the JSON schema once
// so that validating results on the request path never parses it again.
// External $refs are refused: a contract schema must be self-contained.
func NewContract(spec ContractSpec) (*Contract, error) {
	return newContract(spec, func(raw []byte) (*jsonschema.Schema, error) {
		return compileSchemaContext(context.Background(), raw)
	})
}

// newContract builds a contract with compile turning its schema's bytes
// into a compiled schema.
func newContract(spec ContractSpec, compile func([]byte) (*jsonschema.Schema, error)) (*Contract, error) {
	if spec.MaxOutputTokens < 0 {
		return nil, fmt.Errorf("%w: max output tokens %d is negative", ErrInvalidContract, spec.MaxOutputTokens)
	}
	c := &Contract{
		requireComplete: spec.RequireComplete, allowEmpty: spec.AllowEmpty, allowTruncated: spec.AllowTruncated,
		allowContentFilter: spec.AllowContentFilter, maxOutputTokens: spec.MaxOutputTokens,
	}
	seen := make(map[string]bool, len(spec.RequiredFields))
	for i, f := range spec.RequiredFields {
		if f == "" {
			return nil, fmt.Errorf("%w: required field %d is empty", ErrInvalidContract, i)
		}
		if seen[f] {
			continue
		}
		seen[f] = true
		c.requiredFields = append(c.requiredFields, f)
	}
	if len(bytes.TrimSpace(spec.JSONSchema)) > 0 {
		sch, err := compile(spec.JSONSchema)
		if err != nil {
			return nil, fmt.Errorf("%w: json schema: %w", ErrInvalidContract, err)
		}
		c.schema = sch
	}
	return c, nil
}

// compileSchemaContext compiles a configured contract's schema, stopping
// at the next subschema once ctx ends (ErrCompileAborted). Its size is
// neither measured nor bounded: the operator wrote it.
func compileSchemaContext(ctx context.Context, raw []byte) (*jsonschema.Schema, error) {
	sch, _, err := compileSchemaBudget(ctx, raw, 0)
	return sch, err
}

// NeedsComplete reports whether the contract can only be judged on the whole
// answer (complete finish reason, required fields or a JSON schema).
func (c *Contract) NeedsComplete() bool {
	if c == nil {
		return false
	}
	return c.requireComplete || len(c.requiredFields) > 0 || c.schema != nil
}

// RequireComplete reports whether the contract demands a complete finish reason.
func (c *Contract) RequireComplete() bool { return c != nil && c.requireComplete }

// RequiredFields returns a copy of the top-level keys the answer must have.
func (c *Contract) RequiredFields() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.requiredFields...)
}

// HasSchema reports whether the contract carries a JSON schema.
func (c *Contract) HasSchema() bool { return c != nil && c.schema != nil }

// CommitPoint returns the commit point that applies to one request (docs/architecture.md §4
// rule 3): non-streaming requests and contracts that need the whole answer
// commit at complete; otherwise the requested point stands. A zero requested
// point means the streaming default, first_token; tokens:N with N < 1 is read
// as tokens:1; an unknown kind falls back to complete, the strictest point,
// so a bad value can only delay a commit, never let an unjudged answer win.
func (c *Contract) CommitPoint(requested schemas.CommitPoint, streaming bool) schemas.CommitPoint {
	if !streaming || c.NeedsComplete() {
		return schemas.Complete
	}
	switch requested.Kind {
	case "", schemas.CommitFirstToken:
		return schemas.FirstToken
	case schemas.CommitTokens:
		if requested.Tokens < 1 {
			return schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 1}
		}
		return requested
	case schemas.CommitComplete:
		return schemas.Complete
	default:
		return schemas.Complete
	}
}

// completeFinish lists the finish reasons that mean the model ended its
// answer on its own. OpenAI-compatible and Anthropic spellings are both
// listed so adapters may pass the provider's reason through unchanged.
var completeFinish = map[string]bool{
	"stop":          true, // OpenAI
	"tool_calls":    true, // OpenAI
	"function_call": true, // OpenAI, legacy
	"end_turn":      true, // Anthropic
	"stop_sequence": true, // Anthropic
	"tool_use":      true, // Anthropic
}

// knownIncompleteFinish lists finish reasons that end an answer early; they
// may be named in a verdict's reason. Any other reason is reported as unknown.
var knownIncompleteFinish = map[string]bool{
	"length":         true, // OpenAI: max_tokens reached
	"max_tokens":     true, // Anthropic
	"content_filter": true, // OpenAI
	"refusal":        true, // Anthropic
	"pause_turn":     true, // Anthropic
}

// truncatedFinish lists the finish reasons of an answer cut off by an output
// limit; filteredFinish those of an answer a content filter ended. Anthropic's
// spellings are listed too, for callers that pass them through unmapped.
var (
	truncatedFinish = map[string]bool{"length": true, "max_tokens": true}
	filteredFinish  = map[string]bool{"content_filter": true, "refusal": true}
)

// CompleteFinish reports whether a finish reason means the answer is whole:
// "stop", "tool_calls", "end_turn" and their equivalents. Truncation
// ("length", "max_tokens"), filtering ("content_filter") and any reason this
// package does not know are not complete: unknown reasons fail closed.
func CompleteFinish(reason string) bool { return completeFinish[reason] }

// CutShort reports whether a finished answer ended at its output limit
// ("length", "max_tokens") below the max_tokens its caller asked for: the
// one fault of a valid-looking answer that more output — a continuation's
// (docs/architecture.md §6, "Rescue") — can mend.
func CutShort(obs Observation) bool {
	return truncatedFinish[obs.FinishReason] && obs.MaxTokens > 0 && obs.Tokens < obs.MaxTokens
}

// WithResponseFormat adds the caller's OpenAI response_format to the pool's
// contract: "json_schema" makes the answer's JSON satisfy the given schema,
// "json_object" makes it a JSON object, and either requires a complete
// answer — a truncated JSON document never wins. "text" and an absent
// response_format leave the spec as it is; ok reports whether it changed.
// The schema is compiled by NewContract, which reports one that does not
// compile as ErrInvalidContract.
func (s ContractSpec) WithResponseFormat(raw json.RawMessage) (spec ContractSpec, ok bool, err error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return s, false, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return s, false, fmt.Errorf("%w: %v", ErrInvalidResponseFormat, err)
	}
	var schema []byte
	switch rf.Type {
	case "text":
		return s, false, nil
	case "json_object":
		schema = []byte(`{"type":"object"}`)
	case "json_schema":
		if rf.JSONSchema == nil || len(bytes.TrimSpace(rf.JSONSchema.Schema)) == 0 {
			return s, false, fmt.Errorf("%w: json_schema.schema is required", ErrInvalidResponseFormat)
		}
		schema = rf.JSONSchema.Schema
		if err := CheckSchemaLimits(schema); err != nil {
			return s, false, fmt.Errorf("%w: %w", ErrInvalidResponseFormat, err)
		}
	default:
		return s, false, fmt.Errorf("%w: type %q is not text, json_object or json_schema", ErrInvalidResponseFormat, rf.Type)
	}
	if len(s.JSONSchema) > 0 {
		// Both must hold: the pool's schema and the caller's. Each becomes
		// a resource of its own, so a reference inside either ("#/$defs/x")
		// still resolves within it once nested.
		schema = []byte(`{"allOf":[` + string(withID(s.JSONSchema, "urn:hedgerow:contract:pool")) + `,` +
			string(withID(schema, "urn:hedgerow:contract:request")) + `]}`)
	}
	s.JSONSchema, s.RequireComplete = schema, true
	return s, true, nil
}

// withID gives a schema object an $id when it has none; anything else (a
// boolean schema, or bytes NewContract will refuse) is returned as it is.
func withID(schema []byte, id string) []byte {
	var obj map[string]json.RawMessage
	if json.Unmarshal(schema, &obj) != nil || obj == nil {
		return schema
	}
	if _, has := obj["$id"]; has {
		return schema
	}
	obj["$id"], _ = json.Marshal(id)
	out, err := json.Marshal(obj)
	if err != nil {
		return schema
	}
	return out
}
