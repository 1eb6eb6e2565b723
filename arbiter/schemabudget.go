package arbiter

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"regexp/syntax"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchemaBudget compiles a schema within ctx and, when maxBytes > 0,
// within a size budget (docs/architecture.md §6): it returns the compiled
// schema's measured size (retainedSize), and a *SchemaBudgetError with
// ErrSchemaTooLarge when that size is over maxBytes. Regular expressions,
// the one part of a schema whose compiled form is not bounded by its text
// (a 20-byte "^[a-z]{1000}$" compiles to 40 KB), are weighed as the
// compiler makes them and stop the compile once they are over budget, so a
// schema built to be large is refused before it is. ctx is checked at every
// subschema (ErrCompileAborted with ctx's error).
func compileSchemaBudget(ctx context.Context, raw []byte, maxBytes int64) (*jsonschema.Schema, int64, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, 0, fmt.Errorf("parse: %w", err)
	}
	budget := &regexpBudget{limit: maxBytes}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	// An empty scheme map refuses every external reference (file, http):
	// validating a result must never touch the filesystem or the network.
	comp.UseLoader(jsonschema.SchemeURLLoader{})
	if maxBytes > 0 {
		comp.UseRegexpEngine(budget.compile)
	}
	comp.RegisterVocabulary(abortVocabulary(ctx, budget))
	comp.AssertVocabs()
	if err := comp.AddResource(contractSchemaURL, doc); err != nil {
		return nil, 0, fmt.Errorf("add resource: %w", err)
	}
	sch, err := comp.Compile(contractSchemaURL)
	if budget.over {
		// The compiler's error quotes the pattern; the budget is the cause.
		return nil, 0, schemaTooLarge(maxBytes)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("compile: %w", err)
	}
	if maxBytes <= 0 {
		return sch, 0, nil
	}
	size := retainedSize(sch)
	if size > maxBytes {
		return nil, 0, schemaTooLarge(maxBytes)
	}
	return sch, size, nil
}

// schemaTooLarge is the refusal of a schema over the size budget.
func schemaTooLarge(maxBytes int64) error {
	return &SchemaBudgetError{Budget: "compiled size", Limit: formatBytes(maxBytes), err: ErrSchemaTooLarge}
}

// formatBytes writes a size as a caller reads it: whole MiB or KiB when
// it is one, bytes otherwise.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// regexpBudget is the regular-expression engine of one compile: it weighs
// each expression before compiling it (instructionBytes per instruction
// its program will have, from the parsed expression alone) and after (its
// measured size), and refuses every expression once their total is over
// limit, the schema's own budget. The compiler compiles each pattern
// twice, once validating the document against its metaschema and once for
// the schema, so a schema's patterns may hold half its budget: the rest is
// the garbage of the first pass, which a refused compile then leaves less
// of. One compile runs on one goroutine: no locking.
type regexpBudget struct {
	limit int64
	used  int64
	over  bool
}

// instructionBytes is what one instruction of a compiled regular
// expression holds at least (a syntax.Inst).
const instructionBytes = 40

func (b *regexpBudget) compile(pattern string) (jsonschema.Regexp, error) {
	if !b.over && b.used+instructionBytes*regexpInstructions(pattern) > b.limit {
		b.over = true
	}
	if b.over {
		return nil, ErrSchemaTooLarge
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	if b.used += retainedSize(re); b.used > b.limit {
		b.over = true
		return nil, ErrSchemaTooLarge
	}
	return re, nil
}

// regexpInstructions estimates, from its parse alone, how many
// instructions a pattern's program will have once its counted repetitions
// are expanded; 0 for a pattern that does not parse (regexp.Compile then
// says why).
func regexpInstructions(pattern string) int64 {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0
	}
	return instructions(re)
}

// instructions is the expanded size of a parsed expression, saturating
// far above any budget rather than overflowing.
func instructions(re *syntax.Regexp) int64 {
	const ceiling = 1 << 40
	switch re.Op {
	case syntax.OpLiteral:
		return max(1, int64(len(re.Rune)))
	case syntax.OpRepeat:
		n := int64(re.Max)
		if n < 0 {
			n = int64(re.Min) + 1
		}
		return min(ceiling, max(1, n)*instructions(re.Sub[0])+1)
	}
	n := int64(1)
	for _, sub := range re.Sub {
		n = min(ceiling, n+instructions(sub))
	}
	return n
}

// abortVocabulary is a keyword-less vocabulary whose only work is to stop a
// compile once ctx ends or its regular expressions are over budget: the
// compiler calls it for every schema object, so a compile stops within one
// subschema of its caller leaving.
func abortVocabulary(ctx context.Context, budget *regexpBudget) *jsonschema.Vocabulary {
	return &jsonschema.Vocabulary{
		URL: "urn:hedgerow:vocab:abort",
		Compile: func(*jsonschema.CompilerContext, map[string]any) (jsonschema.SchemaExt, error) {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrCompileAborted, err)
			}
			if budget.over {
				return nil, ErrSchemaTooLarge
			}
			return nil, nil
		},
	}
}
