package delay

import "testing"

func TestMaxTokensBucketGroupsRequestsIntoFewCohorts(t *testing.T) {
	tests := []struct {
		maxTokens, want int
	}{
		{-5, 0}, {0, 0}, {1, 64}, {64, 64}, {65, 256}, {512, 1024}, {1024, 1024},
		{4000, 4096}, {16384, 16384}, {20000, 65536}, {1 << 30, 65536},
	}
	for _, tt := range tests {
		if got := MaxTokensBucket(tt.maxTokens); got != tt.want {
			t.Errorf("MaxTokensBucket(%d) = %d, want %d", tt.maxTokens, got, tt.want)
		}
	}
}

func TestCohortKeyIsStableAndUnambiguous(t *testing.T) {
	tests := []struct {
		name   string
		cohort Cohort
		want   string
	}{
		{"streamed chat", NewCohort("chat", "gpt4o", true, 500), "chat/gpt4o/stream/mt1024"},
		{"unary without max_tokens", NewCohort("embed", "small", false, 0), "embed/small/nostream/mt0"},
		{"slash in a class is escaped", NewCohort("a/b", "c", false, 0), "a%2Fb/c/nostream/mt0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cohort.Key(); got != tt.want {
				t.Errorf("Key() = %q, want %q", got, tt.want)
			}
		})
	}
	if NewCohort("a/b", "c", false, 0).Key() == NewCohort("a", "b/c", false, 0).Key() {
		t.Error("cohorts with a slash moved between classes share a key")
	}
}

func TestEmbeddingsCohortsHaveKeysOfTheirOwn(t *testing.T) {
	chat := NewCohort("default", "general", false, 0)
	emb := chat
	emb.Kind = KindEmbeddings
	if chat.Key() != "default/general/nostream/mt0" || emb.Key() != "default/general/embeddings/mt0" {
		t.Fatalf("keys %q and %q", chat.Key(), emb.Key())
	}
	if chat == emb {
		t.Fatal("an embeddings cohort equals the chat cohort of the same class and pool")
	}
}
