package config

import "testing"

const embeddingsYAML = `
routes:
  - name: a
    provider: openai
    base_url: http://127.0.0.1:9101/v1
    model: m
  - name: b
    provider: anthropic
    base_url: http://127.0.0.1:9102
    model: m
pools:
  general:
    routes: [a, b]
  text-embedding-3-small:
    kind: embeddings
    routes: [a]
`

func TestAnEmbeddingsPoolOfOpenAIRoutesIsValid(t *testing.T) {
	c, ps := parse(t, embeddingsYAML, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if !c.Pools["text-embedding-3-small"].IsEmbeddings() || c.Pools["general"].IsEmbeddings() {
		t.Fatalf("pool kinds %q and %q", c.Pools["text-embedding-3-small"].Kind, c.Pools["general"].Kind)
	}
}

func TestAnEmbeddingsPoolRefusesAnthropicRoutesAContractAndUnknownKinds(t *testing.T) {
	_, ps := parse(t, embeddingsYAML+`  emb-mixed:
    kind: embeddings
    routes: [a, b]
    contract: {require_complete: true}
  odd:
    kind: images
    routes: [a]
`, RoleServe, noEnv)
	wantProblem(t, ps, "pools.emb-mixed.routes[1]", "serves no embeddings")
	wantProblem(t, ps, "pools.emb-mixed.contract", "no contract")
	wantProblem(t, ps, "pools.odd.kind", "neither chat nor embeddings")
}
