package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// arrival is a held provider request: who sent it and a channel closed when
// its client's connection is gone.
type arrival struct {
	caller string
	gone   <-chan struct{}
}

// provider is an OpenAI-compatible chat completions server in the test
// process. Each caller reaches it under its own base URL,
// http://host/<caller>/v1, so a request tells which route or worker process
// sent it. It answers "answer from <caller>" as a stream of one word per
// chunk after firstByte, unless the test holds requests (see hold).
type provider struct {
	srv       *httptest.Server
	firstByte time.Duration
	held      chan arrival  // every held request, as it arrives
	closing   chan struct{} // closed first by cleanup, ending every held request

	mu         sync.Mutex
	served     int           // chat completion requests received
	holds      int           // how many of the next requests to hold; -1: all
	afterFirst bool          // hold after the first word instead of before the first byte
	release    chan struct{} // closed to let the held requests answer
}

// newProvider starts a provider; the test's cleanup ends its held requests
// and closes it.
func newProvider(t *testing.T, firstByte time.Duration) *provider {
	t.Helper()
	p := &provider{firstByte: firstByte, held: make(chan arrival, 1024), closing: make(chan struct{})}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() {
		close(p.closing)
		p.srv.Close()
	})
	return p
}

// baseURL is the base_url a route configured for caller uses.
func (p *provider) baseURL(caller string) string { return p.srv.URL + "/" + caller + "/v1" }

// hold makes the next n requests (n < 0: every request until release) wait
// without answering until release is called or their client goes away, and
// reports each on p.held. Release answers them as usual.
func (p *provider) hold(n int) (release func()) { return p.setHold(n, false) }

// holdMidStream is hold, but each held request first sends the first word
// of its answer: the stream has begun, and then stalls.
func (p *provider) holdMidStream(n int) (release func()) { return p.setHold(n, true) }

func (p *provider) setHold(n int, afterFirst bool) (release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan struct{})
	p.holds, p.afterFirst, p.release = n, afterFirst, ch
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.release == ch {
				p.holds, p.release = 0, nil
			}
			p.mu.Unlock()
			close(ch)
		})
	}
}

// requests is how many chat completion requests the provider received.
func (p *provider) requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served
}

// takeHold says whether and where this request is held, and on what.
func (p *provider) takeHold() (release <-chan struct{}, afterFirst, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holds == 0 || p.release == nil {
		return nil, false, false
	}
	if p.holds > 0 {
		p.holds--
	}
	return p.release, p.afterFirst, true
}

// wait reports a held request on p.held and waits for release; false means
// the client went away or the provider is closing.
func (p *provider) wait(r *http.Request, caller string, release <-chan struct{}) bool {
	select {
	case p.held <- arrival{caller: caller, gone: r.Context().Done()}:
	default: // nobody is waiting for this many
	}
	select {
	case <-release:
		return true
	case <-r.Context().Done():
	case <-p.closing:
	}
	return false
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	caller, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if rest != "v1/chat/completions" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	// Read the body as a provider does: net/http notices a client going
	// away only once the request has been consumed.
	_, _ = io.Copy(io.Discard, r.Body)
	p.mu.Lock()
	p.served++
	p.mu.Unlock()
	release, afterFirst, held := p.takeHold()
	if held && !afterFirst && !p.wait(r, caller, release) {
		return
	}
	wait := time.NewTimer(p.firstByte)
	defer wait.Stop()
	select {
	case <-wait.C:
	case <-r.Context().Done():
		return
	case <-p.closing:
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	chunk := func(delta, finish string) {
		fr := "null"
		if finish != "" {
			fr = `"` + finish + `"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", delta, fr)
		if fl != nil {
			fl.Flush()
		}
	}
	words := strings.Fields(answerFrom(caller))
	for i, word := range words {
		if i > 0 {
			word = " " + word
		}
		chunk(word, "")
		if i == 0 && held && afterFirst && !p.wait(r, caller, release) {
			return
		}
	}
	chunk("", "stop")
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],"+
		"\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", len(words), len(words)+10)
	if fl != nil {
		fl.Flush()
	}
}

// answerFrom is the content the provider answers caller with.
func answerFrom(caller string) string { return "answer from " + caller }
