package upstream

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas/jsonscan"
)

// chunkCases are chunk payloads, well-formed and not, on which decodeChunk
// must read exactly what json.Unmarshal reads. They seed FuzzDecodeChunk too.
var chunkCases = []struct {
	name string
	data string
}{
	{"content token", `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null}`},
	{"role chunk", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`},
	{"finish and usage", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`},
	{"final usage only", `{"choices":[],"usage":{"prompt_tokens":82,"completion_tokens":17}}`},
	{"tool calls kept raw", `{"choices":[{"index":0,"delta":{"tool_calls":[ {"index":0,"function":{"arguments":"{\"loc"}} ]}}]}`},
	{"refusal", `{"choices":[{"index":0,"delta":{"refusal":"no"}}]}`},
	{"reasoning_content kept raw", `{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"Let me think"}}]}`},
	{"reasoning kept raw", `{"choices":[{"index":0,"delta":{"content":"","reasoning":"Hmm"}}]}`},
	{"reasoning as an object", `{"choices":[{"index":0,"delta":{"reasoning":{"text":"Hmm","nested":[1]}}}]}`},
	{"reasoning null", `{"choices":[{"index":0,"delta":{"reasoning_content":null,"reasoning":null}}]}`},
	{"duplicate reasoning key", `{"choices":[{"delta":{"reasoning":"a","reasoning":"b"}}]}`},
	{"escaped content", `{"choices":[{"delta":{"content":"a\nb \"q\" \u00e9 \ud83d\ude00 \/"}}]}`},
	{"lone surrogate", `{"choices":[{"delta":{"content":"\ud800x"}}]}`},
	{"invalid UTF-8 in content", "{\"choices\":[{\"delta\":{\"content\":\"a\xffb\"}}]}"},
	{"unicode content", `{"choices":[{"delta":{"content":"héllo 世界"}}]}`},
	{"whitespace everywhere", " \t\n{ \"choices\" : [ { \"index\" : 0 , \"delta\" : { \"content\" : \"x\" } } ] , \"usage\" : null }\r\n"},
	{"second choice", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}`},
	{"error object", `{"error":{"message":"overloaded","type":"server_error","code":null}}`},
	{"error null", `{"error":null,"choices":[]}`},
	{"null everywhere", `{"choices":[{"index":null,"delta":null,"finish_reason":null}],"usage":{"prompt_tokens":null}}`},
	{"choices null", `{"choices":null}`},
	{"empty object", `{}`},
	{"nested unknowns", `{"x":{"a":[1,2.5e-3,-0,true,false,null,{"b":"c"}]},"choices":[{"logprobs":{"content":[{"token":"a","logprob":-0.1}]},"delta":{"content":"a"}}]}`},
	{"top-level null", `null`},
	{"top-level array", `[]`},
	{"top-level string", `"x"`},
	{"case-folded key", `{"Choices":[{"Delta":{"Content":"a"}}]}`},
	{"kelvin sign folds to k", `{"choices":[],"usage":{"prompt_to` + "\u212a" + `ens":3}}`},
	{"escaped key", `{"\u0063hoices":[{"delta":{"content":"a"}}]}`},
	{"duplicate key", `{"choices":[{"delta":{"content":"a"}}],"choices":[{"index":0}]}`},
	{"duplicate nested key", `{"choices":[{"delta":{"content":"a","content":null}}]}`},
	{"index as float", `{"choices":[{"index":0.0}]}`},
	{"index with exponent", `{"choices":[{"index":1e0}]}`},
	{"index as string", `{"choices":[{"index":"0"}]}`},
	{"index too large", `{"choices":[{"index":99999999999999999999}]}`},
	{"content as number", `{"choices":[{"delta":{"content":7}}]}`},
	{"choices as object", `{"choices":{"index":0}}`},
	{"choice as null", `{"choices":[null]}`},
	{"usage as array", `{"usage":[]}`},
	{"trailing comma", `{"choices":[],}`},
	{"trailing garbage", `{"choices":[]} x`},
	{"two documents", `{} {}`},
	{"unterminated string", `{"choices":[{"delta":{"content":"a}}]}`},
	{"control character in string", "{\"choices\":[{\"delta\":{\"content\":\"a\x01\"}}]}"},
	{"bad escape", `{"choices":[{"delta":{"content":"\x"}}]}`},
	{"short unicode escape", `{"choices":[{"delta":{"content":"\u12"}}]}`},
	{"bad number", `{"x":01}`},
	{"bad literal", `{"x":nul}`},
	{"missing colon", `{"choices" []}`},
	{"empty", ``},
	{"deep nesting", `{"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`},
}

// checkDecodeChunk fails t unless decodeChunk reads data as json.Unmarshal
// does: the same value, or the same error.
func checkDecodeChunk(t *testing.T, data []byte) {
	t.Helper()
	var want chatCompletionChunk
	wantErr := json.Unmarshal(data, &want)
	// Decode into a scratch chunk that held an earlier chunk, as the
	// accumulator does.
	got := chatCompletionChunk{Choices: make([]chunkChoice, 3)}
	got.Choices[0].Index, got.Choices[1].Delta.ToolCalls = 7, json.RawMessage(`[1]`)
	got = chatCompletionChunk{Choices: got.Choices[:0]}
	gotErr := decodeChunk(data, &got)
	got = withoutStores(got)
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Fatalf("decodeChunk(%q) error = %v, json.Unmarshal error = %v", data, gotErr, wantErr)
	case gotErr != nil && gotErr.Error() != wantErr.Error():
		t.Fatalf("decodeChunk(%q) error = %q, json.Unmarshal error = %q", data, gotErr, wantErr)
	case gotErr == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("decodeChunk(%q) = %s, json.Unmarshal = %s", data, dumpChunk(got), dumpChunk(want))
	}
}

// withoutStores copies c with the strings the fast pass points at moved out
// of the chunk, which is its own business.
func withoutStores(c chatCompletionChunk) chatCompletionChunk {
	if c.Choices == nil {
		return c
	}
	choices := make([]chunkChoice, len(c.Choices))
	for i, ch := range c.Choices {
		choices[i] = chunkChoice{Index: ch.Index, FinishReason: clonePtr(ch.FinishReason), Delta: chunkDelta{
			Content: clonePtr(ch.Delta.Content), Refusal: clonePtr(ch.Delta.Refusal), ToolCalls: ch.Delta.ToolCalls,
			ReasoningContent: ch.Delta.ReasoningContent, Reasoning: ch.Delta.Reasoning}}
	}
	c.Choices = choices
	return c
}

func clonePtr(p *string) *string {
	if p == nil {
		return nil
	}
	s := *p
	return &s
}

func dumpChunk(c chatCompletionChunk) string {
	b, _ := json.Marshal(c)
	return string(b)
}

func TestDecodeChunkReadsWhatEncodingJSONReads(t *testing.T) {
	for _, tc := range chunkCases {
		t.Run(tc.name, func(t *testing.T) { checkDecodeChunk(t, []byte(tc.data)) })
	}
}

// TestFastPassReadsProviderChunks checks that the chunks providers actually
// send are read by the fast pass, not handed to encoding/json.
func TestFastPassReadsProviderChunks(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "stream_*.sse"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no stream fixtures: %v", err)
	}
	read := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := newEventReader(bytes.NewReader(raw))
		for {
			_, data, err := r.nextBytes()
			if err != nil {
				break
			}
			if !json.Valid(data) || bytes.Contains(data, []byte(`"error"`)) {
				continue // [DONE], the malformed fixture, error events
			}
			var c chatCompletionChunk
			p := chunkParser{jsonscan.Scanner{Data: data}}
			if !p.chunk(&c) {
				t.Errorf("%s: fast pass declined %s", f, data)
			}
			checkDecodeChunk(t, data)
			read++
		}
		r.release()
	}
	if read < 10 {
		t.Errorf("read %d provider chunks, want at least 10", read)
	}
}

func FuzzDecodeChunk(f *testing.F) {
	for _, tc := range chunkCases {
		f.Add([]byte(tc.data))
	}
	f.Fuzz(checkDecodeChunk)
}

// BenchmarkDecodeChunk compares the fast pass with encoding/json on a
// typical content chunk.
func BenchmarkDecodeChunk(b *testing.B) {
	data := []byte(chunkCases[0].data)
	b.Run("decodeChunk", func(b *testing.B) {
		b.ReportAllocs()
		var c chatCompletionChunk
		for b.Loop() {
			c = chatCompletionChunk{Choices: c.Choices[:0]}
			if err := decodeChunk(data, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c chatCompletionChunk
			if err := json.Unmarshal(data, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
