package fakellm_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// conversation is the chat conversation chatBody and messagesBody ask
// prompt in, as FullText takes it.
func conversation(prompt string) []schemas.Message {
	return []schemas.Message{
		{Role: schemas.MessageSystem, Content: schemas.TextContent("be brief")},
		{Role: schemas.MessageUser, Content: schemas.TextContent(prompt)},
	}
}

// fullText is fakellm.FullText, failing the test on an error.
func fullText(t *testing.T, m *workload.Model, prompt string, maxTokens int) string {
	t.Helper()
	text, err := fakellm.FullText(m, conversation(prompt), maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// reply is what an answer said, in either API.
type reply struct {
	text          string
	input, output int
	finish        string // the chat API's: stop or length
}

// readReply decodes a 200 answer from path, streamed or not.
func readReply(t *testing.T, path string, stream bool, body []byte) reply {
	t.Helper()
	switch {
	case path == "/v1/messages" && stream:
		s := readMessagesStream(t, body)
		return reply{s.text, int(s.inputTokens), int(s.outputTokens), chatFinish(s.stopReason)}
	case path == "/v1/messages":
		var m message
		if err := json.Unmarshal(body, &m); err != nil || len(m.Content) != 1 || m.StopReason == nil {
			t.Fatalf("not a message: %v: %s", err, body)
		}
		return reply{m.Content[0].Text, m.Usage.InputTokens, m.Usage.OutputTokens, chatFinish(*m.StopReason)}
	case stream:
		s := parseStream(t, body, true)
		return reply{s.content, s.usage.PromptTokens, s.usage.CompletionTokens, s.finishReason}
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 || c.Usage == nil {
		t.Fatalf("not a chat completion: %v: %s", err, body)
	}
	return reply{c.Choices[0].Message.Content, c.Usage.PromptTokens, c.Usage.CompletionTokens, c.Choices[0].FinishReason}
}

// chatFinish is the chat API's finish reason of a Messages stop reason.
func chatFinish(stopReason string) string {
	if stopReason == "max_tokens" {
		return "length"
	}
	return "stop"
}

// ask sends body to path and returns the status and the answer's body.
func (fs *fakeServer) ask(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	if path == "/v1/messages" {
		status, _, data := fs.postMessages(t, body)
		return status, data
	}
	status, _, data := fs.post(t, body)
	return status, data
}

// continuationStyle is how a style's request carries a partial answer.
type continuationStyle struct {
	style fakellm.Continuation
	path  string
	// body asks prompt again with partial as the answer's start; extra
	// holds more top-level fields.
	body func(prompt, partial, extra string) string
}

var continuationStyles = []continuationStyle{
	{fakellm.ContinuationPrefill, "/v1/messages", func(prompt, partial, extra string) string {
		return `{"model":"claude-fake","max_tokens":1000,"system":"be brief","messages":[{"role":"user","content":` +
			quote(prompt) + `},{"role":"assistant","content":` + quote(partial) + `}]` + extra + `}`
	}},
	{fakellm.ContinuationFinalMessage, "/v1/chat/completions", func(prompt, partial, extra string) string {
		return chatContinuationBody(prompt, `{"role":"assistant","content":`+quote(partial)+`}`,
			`,"continue_final_message":true,"add_generation_prompt":false`+extra)
	}},
	{fakellm.ContinuationPrefix, "/v1/chat/completions", func(prompt, partial, extra string) string {
		return chatContinuationBody(prompt, `{"role":"assistant","content":`+quote(partial)+`,"prefix":true}`, extra)
	}},
}

// chatContinuationBody is chatBody's conversation followed by the message
// last, with extra top-level fields (each after a comma).
func chatContinuationBody(prompt, last, extra string) string {
	return `{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":` +
		quote(prompt) + `},` + last + `]` + extra + `}`
}

// streamExtra asks for a stream, with usage in the chat API.
func streamExtra(path string) string {
	if path == "/v1/messages" {
		return `,"stream":true`
	}
	return `,"stream":true,"stream_options":{"include_usage":true}`
}

// tokens splits the fake's answer text into its tokens: words, each after
// the first with its leading space.
func tokens(text string) []string {
	words := strings.Split(text, " ")
	for i := 1; i < len(words); i++ {
		words[i] = " " + words[i]
	}
	return words
}

func TestTheFullTextIsTheSameWhateverSeedRouteStreamOrAPI(t *testing.T) {
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction, m.TTFT.HangFraction = 0, 0 // every request answers
	routes := []*fakeServer{
		startServer(t, fakellm.Options{Model: m, Seed: 1, Route: 0, TimeScale: fastScale}),
		startServer(t, fakellm.Options{Model: m, Seed: 2, Route: 1, TimeScale: fastScale}),
		startServer(t, fakellm.Options{Model: m, Seed: 3, Route: 2, TimeScale: fastScale, Continuation: fakellm.ContinuationPrefill}),
	}
	for _, prompt := range []string{"one", "two", "three", "four"} {
		for _, maxTokens := range []int{0, 5} {
			want := fullText(t, m, prompt, maxTokens)
			if uncapped := fullText(t, m, prompt, 0); !strings.HasPrefix(uncapped, want) {
				t.Fatalf("%q: the text capped at %d is no prefix of the whole text", prompt, maxTokens)
			}
			chatCap, messagesCap := "", 1000
			if maxTokens > 0 {
				chatCap, messagesCap = `"max_tokens":5`, maxTokens
			}
			var replies []reply
			for i, fs := range routes {
				path, body := "/v1/chat/completions", chatBody(prompt, chatCap)
				if i == 2 {
					path, body = "/v1/messages", messagesBody(prompt, messagesCap, "")
				}
				stream := i > 0
				if stream {
					body = strings.TrimSuffix(body, "}") + streamExtra(path) + "}"
				}
				status, data := fs.ask(t, path, body)
				if status != http.StatusOK {
					t.Fatalf("%q on route %d: %d %s", prompt, i, status, data)
				}
				replies = append(replies, readReply(t, path, stream, data))
				fs.nextRecord(t)
			}
			for i, r := range replies {
				if r != replies[0] || r.text != want || r.output != len(tokens(want)) {
					t.Errorf("%q capped at %d: route %d said %+v; want the full text %q as route 0 said it, %+v",
						prompt, maxTokens, i, r, want, replies[0])
				}
			}
		}
	}
}

func TestAContinuationFromAnyPrefixAnswersExactlyTheRest(t *testing.T) {
	const length = 12
	m := steadyModel(t, length)
	const prompt = "continue me"
	full := fullText(t, m, prompt, 0)
	toks := tokens(full)
	if len(toks) != length {
		t.Fatalf("full text %q has %d tokens, want %d", full, len(toks), length)
	}
	midToken := 1 // the first token after the first long enough to cut inside
	for len(toks[midToken]) < 3 {
		midToken++
	}
	midWord := strings.Join(toks[:midToken], "") + toks[midToken][:len(toks[midToken])-1]
	for _, st := range continuationStyles {
		t.Run(string(st.style), func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: m, Seed: 8, Route: 1, TimeScale: fastScale, Continuation: st.style})
			// The conversation's own input tokens, from an ordinary request.
			plainBody := chatBody(prompt, "")
			if st.path == "/v1/messages" {
				plainBody = messagesBody(prompt, 1000, "")
			}
			status, data := fs.ask(t, st.path, plainBody)
			if status != http.StatusOK {
				t.Fatalf("ordinary request: %d %s", status, data)
			}
			base := readReply(t, st.path, false, data).input
			fs.nextRecord(t)

			for _, tc := range []struct {
				name    string
				partial string
				// whole is the full text's tokens the partial holds
				// whole; touched counts one it ends inside too.
				whole, touched int
			}{
				{"an empty partial", "", 0, 0},
				// What prefill's gateway sends when the caller already got
				// the space: the partial without it, the space answered.
				{"the first token, its trailing space moved to the answer", toks[0], 1, 1},
				{"a partial ending inside a word", midWord, midToken, midToken + 1},
				{"all but the last token", strings.Join(toks[:length-1], ""), length - 1, length - 1},
				{"the whole answer", full, length, length},
				{"a partial ending on the space before a word", toks[0] + " ", 1, 2},
			} {
				for _, stream := range []bool{false, true} {
					extra := ""
					if stream {
						extra = streamExtra(st.path)
					}
					status, data := fs.ask(t, st.path, st.body(prompt, tc.partial, extra))
					switch {
					case st.style == fakellm.ContinuationPrefill && strings.HasSuffix(tc.partial, " "):
						if status != http.StatusBadRequest || !strings.Contains(string(data), "final assistant content cannot end with trailing whitespace") ||
							anthropicError(t, data) != "invalid_request_error" {
							t.Errorf("%s (stream %v): %d %s; want Anthropic's 400 for trailing whitespace", tc.name, stream, status, data)
						}
						continue
					case status != http.StatusOK:
						t.Fatalf("%s (stream %v): %d %s", tc.name, stream, status, data)
					case stream && tc.whole == length && st.path == "/v1/messages":
						fs.nextRecord(t) // a stream with no text block; the non-streaming answer covers it
						continue
					}
					r := readReply(t, st.path, stream, data)
					want := reply{text: full[len(tc.partial):], input: base + tc.touched, output: length - tc.whole, finish: "stop"}
					if r != want || tc.partial+r.text != full {
						t.Errorf("%s (stream %v): answered %+v; want %+v", tc.name, stream, r, want)
					}
					rec := fs.nextRecord(t)
					if rec.Continuation != st.style || rec.PartialTokens != tc.touched || rec.OutputTokens != length-tc.whole ||
						rec.BilledInputTokens != int64(want.input) || rec.BilledOutputTokens != int64(want.output) {
						t.Errorf("%s (stream %v): record %+v", tc.name, stream, rec)
					}
				}
			}
		})
	}
}

func TestAContinuationsCapCountsOnlyItsNewTokens(t *testing.T) {
	m := steadyModel(t, 12)
	fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale, Continuation: fakellm.ContinuationPrefix})
	full := fullText(t, m, "capped", 0)
	toks := tokens(full)
	partial := strings.Join(toks[:4], "")
	status, data := fs.ask(t, "/v1/chat/completions", continuationStyles[2].body("capped", partial, `,"max_tokens":3`))
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, data)
	}
	if r := readReply(t, "/v1/chat/completions", false, data); r.text != strings.Join(toks[4:7], "") || r.output != 3 || r.finish != "length" {
		t.Errorf("answered %+v; want the next 3 tokens, cut by the cap", r)
	}
}

func TestAContinuationIsRefusedWhenItsPartialIsNoPrefixOrItsStyleIsNotTheRoutes(t *testing.T) {
	m := steadyModel(t, 12)
	const prompt = "refuse me"
	full := fullText(t, m, prompt, 0)
	wrongWord := strings.Replace(full, " ", "  ", 1)[:len(tokens(full)[0])+4]
	for _, tc := range []struct {
		name  string
		style fakellm.Continuation
		path  string
		body  string
		// want is in the refusal's message.
		want string
	}{
		{"a partial that is not a prefix (prefill)", fakellm.ContinuationPrefill, "/v1/messages",
			continuationStyles[0].body(prompt, "nothing like it", ""), "not a prefix"},
		{"a partial with doubled whitespace (continue_final_message)", fakellm.ContinuationFinalMessage, "/v1/chat/completions",
			continuationStyles[1].body(prompt, wrongWord, ""), "not a prefix"},
		{"a partial longer than the answer (prefix)", fakellm.ContinuationPrefix, "/v1/chat/completions",
			continuationStyles[2].body(prompt, full+" more", ""), "longer than"},
		{"prefix on a prefill route", fakellm.ContinuationPrefill, "/v1/chat/completions",
			continuationStyles[2].body(prompt, "the", ""), "does not continue answers by prefix"},
		{"continue_final_message on a prefix route", fakellm.ContinuationPrefix, "/v1/chat/completions",
			continuationStyles[1].body(prompt, "the", ""), "does not continue answers by continue_final_message"},
		{"prefill on a continue_final_message route", fakellm.ContinuationFinalMessage, "/v1/messages",
			continuationStyles[0].body(prompt, "the", ""), "does not continue answers by prefill"},
		{"continue_final_message without add_generation_prompt false", fakellm.ContinuationFinalMessage, "/v1/chat/completions",
			chatContinuationBody(prompt, `{"role":"assistant","content":"the"}`, `,"continue_final_message":true`), "Cannot set both"},
		{"continue_final_message with add_generation_prompt true", fakellm.ContinuationFinalMessage, "/v1/chat/completions",
			chatContinuationBody(prompt, `{"role":"assistant","content":"the"}`, `,"continue_final_message":true,"add_generation_prompt":true`), "Cannot set both"},
		{"continue_final_message after a user message", fakellm.ContinuationFinalMessage, "/v1/chat/completions",
			chatContinuationBody(prompt, `{"role":"user","content":"the"}`, `,"continue_final_message":true,"add_generation_prompt":false`), "assistant message"},
		{"prefix on a user message", fakellm.ContinuationPrefix, "/v1/chat/completions",
			chatContinuationBody(prompt, `{"role":"user","content":"the","prefix":true}`, ""), "only on the last message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale, Continuation: tc.style})
			status, data := fs.ask(t, tc.path, tc.body)
			if status != http.StatusBadRequest || !strings.Contains(string(data), tc.want) {
				t.Fatalf("%d %s; want 400 saying %q", status, data, tc.want)
			}
			if tc.path == "/v1/messages" {
				anthropicError(t, data)
			} else {
				openAIError(t, data)
			}
			if st, err := fs.fake.Stats(0, 0); err != nil || st.Totals.Invalid != 1 || st.Totals.Requests != 0 {
				t.Errorf("stats %+v, %v: want the refusal counted invalid", st.Totals, err)
			}
		})
	}
}

func TestARouteWithoutContinuationAnswersEveryStylesRequestAsANewTurn(t *testing.T) {
	m := steadyModel(t, 12)
	fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale})
	const prompt = "as today"
	conv := append(conversation(prompt), schemas.Message{Role: schemas.MessageAssistant, Content: schemas.TextContent("the")})
	want, err := fakellm.FullText(m, conv, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range continuationStyles {
		status, data := fs.ask(t, st.path, st.body(prompt, "the", ""))
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", st.style, status, data)
		}
		if r := readReply(t, st.path, false, data); r.text != want {
			t.Errorf("%s: answered %q; want the answer to the conversation ending in the assistant turn, %q", st.style, r.text, want)
		}
		if rec := fs.nextRecord(t); rec.Continuation != "" {
			t.Errorf("%s: record %+v marks a continuation", st.style, rec)
		}
	}
}
