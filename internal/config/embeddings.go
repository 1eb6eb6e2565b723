package config

// PoolKind is what a pool serves: the requests its routes can answer.
type PoolKind string

// The pool kinds.
const (
	// PoolChat pools serve chat completions (and Anthropic messages); an
	// empty kind is PoolChat.
	PoolChat PoolKind = "chat"
	// PoolEmbeddings pools serve POST /v1/embeddings, hedged on total time
	// in cohorts of their own (docs/architecture.md §5). Their routes speak
	// the OpenAI API: the Messages API has no embeddings.
	PoolEmbeddings PoolKind = "embeddings"
)

// IsEmbeddings reports whether the pool serves embeddings.
func (p Pool) IsEmbeddings() bool { return p.Kind == PoolEmbeddings }

// poolKind checks a pool's kind, and that an embeddings pool has only
// OpenAI-compatible routes and no contract (a contract judges chat answers,
// which an embedding has none of).
func (v *validator) poolKind(p string, pool Pool) {
	switch pool.Kind {
	case "", PoolChat:
		return
	case PoolEmbeddings:
	default:
		v.addf(p+".kind", "%q is neither chat nor embeddings", pool.Kind)
		return
	}
	for i, rn := range pool.Routes {
		if r, ok := v.cfg.Route(rn); ok && r.Provider == ProviderAnthropic {
			v.addf(indexPath(p+".routes", i), "route %q speaks the Anthropic Messages API, which serves no embeddings; an embeddings pool needs openai routes", rn)
		}
	}
	if pool.Contract.NeedsComplete() {
		v.addf(p+".contract", "an embeddings pool has no contract: contracts judge chat answers")
	}
}
