package schemas

import (
	"encoding/json"
	"errors"
	"testing"
)

func embeddingRequest() ChatRequest {
	return ChatRequest{Model: "text-embedding-3-small", Embedding: &EmbeddingRequest{Input: []string{"a", "b"}, Dimensions: 8},
		Extra: map[string]json.RawMessage{"user": json.RawMessage(`"u1"`)}}
}

func TestEmbeddingRequestValidatesAndTravelsInAnAttemptAndAResult(t *testing.T) {
	req := embeddingRequest()
	if err := req.Validate(); err != nil {
		t.Fatal(err)
	}
	if req.RequestKind() != KindEmbeddings || (&ChatRequest{}).RequestKind() != KindChat {
		t.Fatal("request kinds are wrong")
	}
	att := Attempt{V: Version, GroupID: "g1", UserActionID: "ua_1", Attempt: 1, Role: RolePrimary, Route: "r1",
		OperationClass: "default", ModelClass: "emb", DeadlineUnixMs: 1, RemainingMs: 1,
		CommitPoint: Complete, ReplyInbox: "_INBOX.a", Secret: "0123456789abcdef0123456789abcdef", Request: req}
	data, err := json.Marshal(att)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(KindAttempt, data); err != nil {
		t.Fatalf("attempt with an embeddings request: %v", err)
	}
	res := AttemptResult{V: Version, GroupID: "g1", Attempt: 1, WorkerID: "w1", StatusClass: StatusOK, ErrorScope: ScopeNone, Secret: "0123456789abcdef0123456789abcdef",
		Embeddings: json.RawMessage(`[{"object":"embedding","index":0,"embedding":[0.5,-0.25]}]`)}
	data, err = json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(KindAttemptResult, data); err != nil {
		t.Fatalf("result with embeddings: %v", err)
	}
	reply, err := DecodeReply(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(reply.(*AttemptResult).Embeddings); got != string(res.Embeddings) {
		t.Fatalf("decoded embeddings %s, want %s", got, res.Embeddings)
	}
}

func TestEmbeddingRequestIsRefusedBeyondItsBoundsAndByAnthropicRoutes(t *testing.T) {
	many := make([]string, MaxEmbeddingInputs+1)
	for i := range many {
		many[i] = "x"
	}
	for name, mutate := range map[string]func(*ChatRequest){
		"no input":        func(r *ChatRequest) { r.Embedding.Input = nil },
		"empty text":      func(r *ChatRequest) { r.Embedding.Input = []string{""} },
		"too many inputs": func(r *ChatRequest) { r.Embedding.Input = many },
		"dimensions":      func(r *ChatRequest) { r.Embedding.Dimensions = MaxEmbeddingDimensions + 1 },
		"encoding":        func(r *ChatRequest) { r.Embedding.EncodingFormat = "int8" },
		"streamed":        func(r *ChatRequest) { r.Stream = true },
		"typed in extra":  func(r *ChatRequest) { r.Extra["input"] = json.RawMessage(`"x"`) },
	} {
		req := embeddingRequest()
		mutate(&req)
		if err := req.Validate(); !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("%s: Validate = %v, want ErrMalformedRequest", name, err)
		}
	}
	req := embeddingRequest()
	if _, err := req.ForDialect(DialectOpenAI); err != nil {
		t.Fatalf("openai route: %v", err)
	}
	_, err := req.ForDialect(DialectAnthropic)
	var ue *UntranslatableError
	if !errors.As(err, &ue) || ue.Param != "model" {
		t.Fatalf("anthropic route: %v, want an UntranslatableError naming model", err)
	}
}

func TestEmbeddingRequestsFingerprintByTheirInput(t *testing.T) {
	key := []byte("k")
	a, b := embeddingRequest(), embeddingRequest()
	b.Embedding.Input = []string{"a", "c"}
	fa, _ := a.Fingerprint(key)
	fb, _ := b.Fingerprint(key)
	fc, _ := (&ChatRequest{}).Fingerprint(key)
	if fa == fb || fa == fc {
		t.Fatalf("fingerprints %s %s %s: inputs must tell embeddings requests apart", fa, fb, fc)
	}
}
