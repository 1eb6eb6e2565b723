package delay

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Cohort is the class of requests that share one latency distribution: what
// is known when a request arrives, before any attempt runs. Hedge delays,
// control samples and guardrail decisions are all kept per cohort, so a short
// code completion never waits on the tail of a long conversational answer.
type Cohort struct {
	// Operation is the policy's operation class (e.g. "chat").
	Operation string
	// Model is the pool's model class (e.g. "gpt4o").
	Model string
	// Stream says whether the caller asked for a streamed answer.
	Stream bool
	// MaxTokens is the max_tokens bucket from MaxTokensBucket, not the raw value,
	// so that cohorts stay few and each one gathers samples quickly.
	MaxTokens int
	// Kind is the operation the request asks of the provider: "" for a
	// chat completion, KindEmbeddings for an embeddings request, whose
	// latencies must never mix with chat ones.
	Kind string
}

// KindEmbeddings is the Kind of embeddings requests' cohorts.
const KindEmbeddings = "embeddings"

// NewCohort builds the cohort of a request, bucketing its raw max_tokens.
func NewCohort(operation, model string, stream bool, maxTokens int) Cohort {
	return Cohort{Operation: operation, Model: model, Stream: stream, MaxTokens: MaxTokensBucket(maxTokens)}
}

// maxTokensBuckets are the upper bounds of the max_tokens buckets. Powers of
// four rather than two: output length drives the total latency roughly
// linearly, and coarser buckets keep each cohort warm on modest traffic.
var maxTokensBuckets = [...]int{64, 256, 1024, 4096, 16384, 65536}

// MaxTokensBuckets returns every max_tokens bucket a cohort can have, 0
// (unset) first: with the classes, pools and stream flags it enumerates the
// cohorts, so metrics can name each before its first request.
func MaxTokensBuckets() []int { return append([]int{0}, maxTokensBuckets[:]...) }

// MaxTokensBucket maps a request's max_tokens to its cohort bucket: 0 when
// unset (≤ 0), else the smallest bound in 64, 256, 1024, 4096, 16384, 65536
// that is ≥ maxTokens; anything larger shares the last bucket.
func MaxTokensBucket(maxTokens int) int {
	if maxTokens <= 0 {
		return 0
	}
	for _, b := range maxTokensBuckets {
		if maxTokens <= b {
			return b
		}
	}
	return maxTokensBuckets[len(maxTokensBuckets)-1]
}

// Key is the cohort's stable string form, e.g. "chat/gpt4o/stream/mt1024",
// used as a map key, a Redis key part and a record field. Class names are
// path-escaped so that a '/' inside one cannot make two cohorts collide.
func (c Cohort) Key() string {
	var b strings.Builder
	b.WriteString(url.PathEscape(c.Operation))
	b.WriteByte('/')
	b.WriteString(url.PathEscape(c.Model))
	switch {
	case c.Kind == KindEmbeddings:
		// Embeddings never stream: the kind takes the stream segment, and
		// chat keys stay as they were.
		b.WriteString("/embeddings/mt")
	case c.Stream:
		b.WriteString("/stream/mt")
	default:
		b.WriteString("/nostream/mt")
	}
	b.WriteString(strconv.Itoa(c.MaxTokens))
	return b.String()
}

// String returns Key, so cohorts print readably in logs and test failures.
func (c Cohort) String() string { return c.Key() }

// ParseCohortKey inverts Cohort.Key, for cohorts a replica learns of from
// another (sketch and guardrail sharing) before it has seen them. Only the canonical form is
// accepted, so a cohort maps to exactly one key.
func ParseCohortKey(k string) (Cohort, error) {
	parts := strings.Split(k, "/")
	if len(parts) != 4 {
		return Cohort{}, fmt.Errorf("delay: cohort key %q: want operation/model/stream/mtN", k)
	}
	op, err1 := url.PathUnescape(parts[0])
	model, err2 := url.PathUnescape(parts[1])
	if err := errors.Join(err1, err2); err != nil {
		return Cohort{}, fmt.Errorf("delay: cohort key %q: %w", k, err)
	}
	var stream bool
	var kind string
	switch parts[2] {
	case "stream":
		stream = true
	case "nostream":
	case KindEmbeddings:
		kind = KindEmbeddings
	default:
		return Cohort{}, fmt.Errorf("delay: cohort key %q: %q is neither stream, nostream nor embeddings", k, parts[2])
	}
	digits, ok := strings.CutPrefix(parts[3], "mt")
	mt, err := strconv.Atoi(digits)
	if !ok || err != nil || mt < 0 || MaxTokensBucket(mt) != mt {
		return Cohort{}, fmt.Errorf("delay: cohort key %q: bad max_tokens bucket %q", k, parts[3])
	}
	c := Cohort{Operation: op, Model: model, Stream: stream, MaxTokens: mt, Kind: kind}
	if c.Key() != k {
		return Cohort{}, fmt.Errorf("delay: cohort key %q is not canonical (%q)", k, c.Key())
	}
	return c, nil
}
