package dispatcher

import (
	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// embeddingsContract judges embeddings answers: complete and well formed
// (one vector per input, which the worker checks), nothing more. A pool's
// contract speaks of chat answers (finish reasons, JSON content), which an
// embedding has none of.
var embeddingsContract = mustContract(arbiter.ContractSpec{})

func mustContract(spec arbiter.ContractSpec) *arbiter.Contract {
	c, err := arbiter.NewContract(spec)
	if err != nil {
		panic("dispatcher: the empty contract does not compile: " + err.Error())
	}
	return c
}

// forEmbeddings is what an embeddings request changes of its group: its
// class's embeddings class (trigger total, docs/architecture.md §5), a
// cohort of the embeddings kind, and the embeddings contract. Being
// non-streaming, it commits at complete (§4 rule 1).
func (d *Dispatcher) forEmbeddings(cl *policy.Class, c delay.Cohort) (*policy.Class, delay.Cohort, *arbiter.Contract) {
	c.Kind = delay.KindEmbeddings
	return d.embeddingClasses[cl.Name], c, embeddingsContract
}

// wellFormed reports whether a result is whole for its request's kind: an
// embeddings answer must carry its vectors.
func (g *group) wellFormed(m *schemas.AttemptResult) bool {
	if g.sub.Request.Embedding != nil && m.StatusClass == schemas.StatusOK {
		return len(m.Embeddings) > 0
	}
	return true
}
