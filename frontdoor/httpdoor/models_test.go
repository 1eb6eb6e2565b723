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
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
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

// TestModelsAskForAKeyWhenTenantsAreConfiguredAndStayOpenWithout: with a
// keyring, listing or getting a model without a valid key is the 401
// invalid_api_key every endpoint answers, with its challenge; a valid key
// (Bearer or x-api-key) lists them; without a keyring anyone may.
func TestModelsAskForAKeyWhenTenantsAreConfiguredAndStayOpenWithout(t *testing.T) {
	keyed := frontDoor(t, frontdoortest.New(frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false)),
		Options{Keyring: frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey("good-key")}})}).URL
	open, _ := aliased(t)
	for _, tc := range []struct {
		name, url string
		headers   map[string]string
		status    int
	}{
		{"the list without a key", keyed + "/v1/models", nil, http.StatusUnauthorized},
		{"one model without a key", keyed + "/v1/models/general", nil, http.StatusUnauthorized},
		{"the list with a wrong key", keyed + "/v1/models", map[string]string{"Authorization": "Bearer bad-key"}, http.StatusUnauthorized},
		{"the list with a valid bearer key", keyed + "/v1/models", map[string]string{"Authorization": "Bearer good-key"}, http.StatusOK},
		{"one model with a valid x-api-key", keyed + "/v1/models/general", map[string]string{"X-Api-Key": "good-key"}, http.StatusOK},
		{"an unknown model with a valid key is still 404", keyed + "/v1/models/nope", map[string]string{"Authorization": "Bearer good-key"}, http.StatusNotFound},
		{"the list with no tenants configured", open + "/v1/models", nil, http.StatusOK},
		{"one model with no tenants configured", open + "/v1/models/gpt-4o", nil, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := frontdoortest.Do(t, http.MethodGet, tc.url, "", tc.headers)
			if resp.StatusCode != tc.status {
				t.Fatalf("GET %s: %d %s, want %d", tc.url, resp.StatusCode, body, tc.status)
			}
			if tc.status != http.StatusUnauthorized {
				return
			}
			if typ, code, _ := openAIErrorOf(t, body); typ != "authentication_error" || code != "invalid_api_key" {
				t.Errorf("error type %q code %q, want authentication_error invalid_api_key", typ, code)
			}
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("a 401 without WWW-Authenticate")
			}
			if strings.Contains(string(body), "general") || strings.Contains(string(body), "bad-key") {
				t.Errorf("a refused caller learns a model or sees its key: %s", body)
			}
		})
	}
}
