package node

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// These tests point the official OpenAI Go SDK's Responses client at a
// whole hedgerow in front of simulated providers (see openai_sdk_test.go).

func responsesQuestion(model string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model:           model,
		Instructions:    openai.String("Answer briefly."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a hedgerow?")},
		MaxOutputTokens: openai.Int(50),
	}
}

func TestSDKResponseThroughTheGateway(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	var raw *http.Response
	r, err := client.Responses.New(context.Background(), responsesQuestion("general"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.Model != "general" || r.CreatedAt == 0 || r.Status != responses.ResponseStatusCompleted {
		t.Fatalf("response %s", r.RawJSON())
	}
	if r.OutputText() == "" || len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" {
		t.Fatalf("output %s", r.RawJSON())
	}
	u := r.Usage
	if u.InputTokens <= 0 || u.OutputTokens <= 0 || u.TotalTokens != u.InputTokens+u.OutputTokens {
		t.Fatalf("usage %+v", u)
	}
	checkHedgeHeaders(t, raw.Header)
}

func TestSDKResponseStreamAccumulatesTheResponse(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	stream := client.Responses.NewStreaming(context.Background(), responsesQuestion("general"))
	defer stream.Close()
	var types []string
	var deltas strings.Builder
	var done string
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.output_text.done":
			done = ev.AsResponseOutputTextDone().Text
		case "response.completed":
			final = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(types) < 8 || types[0] != "response.created" || types[1] != "response.in_progress" || types[len(types)-1] != "response.completed" {
		t.Fatalf("events %v", types)
	}
	if deltas.Len() == 0 || deltas.String() != done || final.OutputText() != done {
		t.Fatalf("deltas %q, done %q, completed %q", deltas.String(), done, final.OutputText())
	}
	if final.Status != responses.ResponseStatusCompleted || !strings.HasPrefix(final.ID, "resp_") ||
		final.Usage.OutputTokens <= 0 || final.Usage.TotalTokens != final.Usage.InputTokens+final.Usage.OutputTokens {
		t.Fatalf("completed %s", final.RawJSON())
	}
}

func TestSDKResponseErrors(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	for _, tc := range []struct {
		name   string
		params responses.ResponseNewParams
		status int
		param  string
	}{
		{"unknown pool", responsesQuestion("nope"), http.StatusNotFound, "model"},
		{"a hosted tool", func() responses.ResponseNewParams {
			p := responsesQuestion("general")
			p.Tools = []responses.ToolUnionParam{{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch}}}
			return p
		}(), http.StatusBadRequest, "tools[0].type"},
		{"every route failing", responsesQuestion("broken"), http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Responses.New(context.Background(), tc.params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Param != tc.param {
				t.Fatalf("err = %v, want status %d param %q", err, tc.status, tc.param)
			}
		})
	}
}
