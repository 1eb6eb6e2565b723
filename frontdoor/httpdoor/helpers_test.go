package httpdoor

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const prompt = frontdoortest.Prompt

// anyValue in an expected header means "present, whatever its value".
const anyValue = "*"

var (
	chatBody        = frontdoortest.ChatBody
	messagesRequest = frontdoortest.MessagesBody
	openAIErrorOf   = frontdoortest.OpenAIError
	sseEvents       = frontdoortest.SSEEvents
)

// frontDoor serves sub over HTTP with opts; the pool "general" of routes a
// and b when opts names no pools.
func frontDoor(t *testing.T, sub frontdoor.Submitter, opts Options) *httptest.Server {
	t.Helper()
	if opts.Pools == nil {
		opts.Pools = map[string][]string{"general": {"a", "b"}}
	}
	h, err := New(sub, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// scripted serves a door in front of a scripted submitter.
func scripted(t *testing.T, script frontdoortest.Script, opts Options) (*httptest.Server, *frontdoortest.Submitter) {
	t.Helper()
	sub := frontdoortest.New(script)
	return frontDoor(t, sub, opts), sub
}

// schemaBomb is a JSON schema nested depth levels of "properties" deep: a
// few bytes a level, and a compile that grows with the square of depth.
func schemaBomb(depth int) string {
	return strings.Repeat(`{"properties":{"a":`, depth) + `{}` + strings.Repeat(`}}`, depth)
}

func post(t *testing.T, ctx context.Context, url, body string, headers map[string]string) *http.Response {
	return frontdoortest.Post(t, ctx, url+"/v1/chat/completions", body, headers)
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}
