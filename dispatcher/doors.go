package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
)

// ID names this dispatcher in group ids and in what its front doors
// register, so an operator can tell replicas apart.
func (d *Dispatcher) ID() string { return d.id }

// HasOperation says whether an operation class has a policy. A front door
// refuses an unknown class: it would silently run under the default policy,
// with another deadline and hedging rule than the caller chose.
func (d *Dispatcher) HasOperation(class string) bool { return d.classes[class] != nil }

// CheckResponseFormat refuses, before any group runs, a response_format the
// contract of the pool model names (its own name or an alias) cannot honour (a schema that does not compile is the
// caller's to fix). Errors match ErrUnknownPool, or ErrBadRequest together
// with arbiter.ErrInvalidResponseFormat (with arbiter.ErrSchemaLimit for a
// schema over the limits, refused before it is parsed) or
// arbiter.ErrInvalidContract (with a *arbiter.SchemaBudgetError for a
// compile over its time or size budget), or ctx's error when the caller
// left during the compile, which ctx stops. The compiled schema is kept for
// the group the request then starts, charged to tenant's share of the
// cache (docs/architecture.md §6).
func (d *Dispatcher) CheckResponseFormat(ctx context.Context, tenant, model string, responseFormat json.RawMessage) error {
	_, err := d.contractFor(ctx, tenant, model, responseFormat)
	return err
}

// MaxTokens is the largest max_tokens a request naming model may ask for
// (its pool's Pool.MaxTokens); 0 for a model no pool answers to. A door
// refuses a request over it before anything runs, naming its parameter.
func (d *Dispatcher) MaxTokens(model string) int {
	pool, ok := d.resolve(model)
	if !ok {
		return 0
	}
	if n := d.pools[pool].MaxTokens; n > 0 {
		return n
	}
	return DefaultMaxTokens
}

// checkDialects refuses, before any group runs, a request that some route
// of its pool could not receive: a member with no equivalent in the route's
// dialect (logit_bias for an Anthropic route, top_k for an OpenAI one) or a
// value that dialect refuses. Refusing for every route, not only the one
// the picker would choose, makes the answer the same whichever route
// serves. The workers' adapters check again (docs/architecture.md §8).
// Errors match ErrBadRequest together with schemas.ErrUntranslatable (a
// *schemas.UntranslatableError naming the member) or
// schemas.ErrMalformedRequest.
func (d *Dispatcher) checkDialects(pool string, req *schemas.ChatRequest) error {
	for _, dl := range d.dialects[pool] {
		if _, err := req.ForDialect(dl); err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	return nil
}

// poolDialects lists, for each pool, the dialects its routes speak, in a
// fixed order. A route the configuration does not list counts as OpenAI.
func poolDialects(routes []route.Route, pools map[string]Pool) map[string][]schemas.Dialect {
	of := make(map[string]schemas.Dialect, len(routes))
	for _, r := range routes {
		of[r.Name] = r.Dialect
	}
	out := make(map[string][]schemas.Dialect, len(pools))
	for name, p := range pools {
		var ds []schemas.Dialect
		for _, r := range p.Routes {
			dl := of[r]
			if dl == "" {
				dl = schemas.DialectOpenAI
			}
			if !slices.Contains(ds, dl) {
				ds = append(ds, dl)
			}
		}
		slices.Sort(ds)
		out[name] = ds
	}
	return out
}
