package httpdoor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
)

// aliased serves a door in front of a scripted submitter whose pool
// "general" answers to the model names a provider uses as well.
func aliased(t *testing.T) (string, *frontdoortest.Submitter) {
	t.Helper()
	sub := frontdoortest.New(frontdoortest.Answer(&dispatcher.Response{Content: "ok", FinishReason: "stop"}, false))
	sub.Aliases = map[string]string{"gpt-4o": "general", "meta-llama/Llama-3-70b": "general"}
	return frontDoor(t, sub, Options{}).URL, sub
}

func TestHTTPModelsListEveryPoolThenItsAliasesAndGetAnyOfThem(t *testing.T) {
	url, _ := aliased(t)
	resp, body := get(t, url+"/v1/models")
	var list modelList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if want := []string{"general", "gpt-4o", "meta-llama/Llama-3-70b"}; !slices.Equal(ids, want) {
		t.Fatalf("models %q, want %q", ids, want)
	}
	for _, name := range ids {
		resp, body := get(t, url+"/v1/models/"+name)
		var m model
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &m) != nil || m.ID != name {
			t.Fatalf("GET /v1/models/%s: %d %s", name, resp.StatusCode, body)
		}
	}
}

func TestHTTPBothDialectsAcceptAnAliasAndEchoTheModelSent(t *testing.T) {
	url, sub := aliased(t)
	for _, tc := range []struct {
		name string
		path string
		body string
	}{
		{"chat completions", "/v1/chat/completions", strings.Replace(chatBody(false, ""), `"model":"general"`, `"model":"gpt-4o"`, 1)},
		{"messages", "/v1/messages", strings.Replace(messagesRequest(false, ""), `"model":"general"`, `"model":"gpt-4o"`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := frontdoortest.Post(t, context.Background(), url+tc.path, tc.body, nil)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var got struct {
				Model string `json:"model"`
			}
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Model != "gpt-4o" {
				t.Fatalf("status %d, body %s: want 200 echoing model gpt-4o", resp.StatusCode, body)
			}
		})
	}
	for _, s := range sub.Submissions() {
		if s.Pool != "gpt-4o" {
			t.Fatalf("submitted model %q, want the name the caller sent", s.Pool)
		}
	}
}

func TestHTTPUnknownModelIsNotFoundNamingTheModelSent(t *testing.T) {
	url, _ := aliased(t)
	resp := post(t, context.Background(), url, strings.Replace(chatBody(false, ""), `"model":"general"`, `"model":"gpt-5"`, 1), nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if _, code, param := openAIErrorOf(t, body); resp.StatusCode != http.StatusNotFound || code != "model_not_found" || param != "model" ||
		!strings.Contains(string(body), `\"gpt-5\"`) {
		t.Fatalf("status %d, body %s: want 404 model_not_found naming gpt-5", resp.StatusCode, body)
	}
	if resp, _ := get(t, url+"/v1/models/gpt-5"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /v1/models/gpt-5: %d, want 404", resp.StatusCode)
	}
}

func TestHTTPAnswerCarriesTheRefusalThatWon(t *testing.T) {
	srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{Refusal: "I can't help with that.", FinishReason: "stop"}, false), Options{})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got struct {
		Choices []struct {
			Message struct {
				Refusal string `json:"refusal"`
			} `json:"message"`
		} `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Choices) != 1 ||
		got.Choices[0].Message.Refusal != "I can't help with that." {
		t.Fatalf("status %d, body %s: want the refusal in the message", resp.StatusCode, body)
	}
}
