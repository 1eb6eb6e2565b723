package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

// chatCompletionChunk is the part of a chat.completion.chunk the adapter
// reads. Error is set instead when a provider reports a failure inside the
// stream. decodeChunk fills it.
type chatCompletionChunk struct {
	Choices []chunkChoice   `json:"choices"`
	Usage   *chunkUsage     `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`

	finishReason string // what decodeChunk points FinishReason at
}

type chunkDelta struct {
	Content   *string         `json:"content"`
	Refusal   *string         `json:"refusal"`
	ToolCalls json.RawMessage `json:"tool_calls"`
	// ReasoningContent and Reasoning are the reasoning text of models that
	// stream it (DeepSeek, vLLM and others name it reasoning_content;
	// OpenRouter, Ollama and newer vLLM reasoning). It is billed output and
	// the first sign of a live model, never part of the answer. Raw, since
	// the adapter only needs to know that some arrived.
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`

	// What decodeChunk points Content and Refusal at, saving an allocation
	// per string; encoding/json ignores them.
	content, refusal string
}

type chunkUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// toolCallDelta is one tool-call fragment of a chunk.
type toolCallDelta struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolCall is an accumulated tool call, in the shape of an assistant
// message's tool_calls entry.
type toolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// accumulator folds a stream's chunks into an Outcome and forwards each
// chunk's output to the sink.
type accumulator struct {
	sink          Sink
	inputEstimate int64 // input units if the provider never reports them

	content   strings.Builder
	refusal   strings.Builder
	calls     map[int]*toolCall
	arguments map[int]*strings.Builder
	finish    string
	tokens    int64 // output tokens counted from deltas

	// running usage, from the final usage chunk or continuous statistics
	promptTokens     int64
	completionTokens int64
	sawPrompt        bool
	finalUsage       bool

	done bool // [DONE] arrived

	// generated is set at the first generated token, when the sink has been
	// told its FirstByte.
	generated bool

	// scratch is the chunk being decoded; its choices' backing array is
	// reused from one chunk to the next.
	scratch chatCompletionChunk
}

func newAccumulator(sink Sink, inputEstimate int64) *accumulator {
	return &accumulator{sink: sink, inputEstimate: inputEstimate}
}

// chunk folds one event's data into the outcome. It returns the error
// object of an error chunk, or an error if the data is not a chunk.
func (a *accumulator) chunk(data []byte) (json.RawMessage, error) {
	c := &a.scratch
	*c = chatCompletionChunk{Choices: c.Choices[:0]}
	if err := decodeChunk(data, c); err != nil {
		return nil, fmt.Errorf("decode chunk: %w", err)
	}
	if e := dropNull(c.Error); e != nil {
		return data, nil
	}
	if c.Usage != nil {
		a.promptTokens, a.sawPrompt = c.Usage.PromptTokens, true
		if len(c.Choices) == 0 {
			a.finalUsage = true
		}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // never asked for n > 1
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			a.finish = *ch.FinishReason
		}
		var d Delta
		if ch.Delta.Content != nil {
			d.Content = *ch.Delta.Content
			a.content.WriteString(d.Content)
		}
		refusal := ""
		if ch.Delta.Refusal != nil {
			refusal = *ch.Delta.Refusal
			a.refusal.WriteString(refusal)
		}
		namedCall := false
		if calls := dropNull(ch.Delta.ToolCalls); calls != nil {
			var err error
			if namedCall, err = a.mergeToolCalls(calls); err != nil {
				return nil, err
			}
			d.ToolCalls = calls
		}
		reasoning := hasReasoning(ch.Delta.ReasoningContent) || hasReasoning(ch.Delta.Reasoning)
		if d.Content != "" || refusal != "" || namedCall || reasoning {
			a.firstToken()
		}
		if d.Content == "" && !namedCall && refusal == "" && !reasoning {
			// Role-only or empty delta, or tool-call fragments that carry
			// an index alone ([] included): no output, so no Delta, which
			// would come before its first byte and count a token.
			continue
		}
		d.Tokens = 1
		if c.Usage != nil && c.Usage.CompletionTokens >= a.completionTokens {
			// Continuous usage statistics: trust the provider's count.
			d.Tokens = int(c.Usage.CompletionTokens - a.completionTokens)
		}
		a.tokens += int64(d.Tokens)
		if d.Content != "" || d.ToolCalls != nil {
			a.sink.Delta(d)
		}
	}
	if c.Usage != nil {
		a.completionTokens = c.Usage.CompletionTokens
	}
	return nil, nil
}

// progress counts the output so far: 0 until the first generated token,
// then one more for every token counted (readEvents' stall bound).
func (a *accumulator) progress() int64 {
	if !a.generated {
		return 0
	}
	return 1 + a.tokens
}

// firstToken tells the sink of the stream's first generated token, once.
func (a *accumulator) firstToken() {
	if !a.generated {
		a.generated = true
		a.sink.FirstByte()
	}
}

// hasReasoning reports whether a reasoning field carries any reasoning:
// a non-empty string, or a non-empty object or array of providers that
// structure it. Null, "" and empty containers are not output.
func hasReasoning(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0, isNull(t):
		return false
	case t[0] == '"':
		return len(t) > 2 // a space is a token too
	case t[0] == '{', t[0] == '[':
		return len(bytes.TrimSpace(t[1:len(t)-1])) > 0
	}
	return true // a number or a boolean: something, though not text
}

// mergeToolCalls joins tool-call fragments by index: the first fragment of a
// call names its id, type and function; later ones add argument text. named
// reports that a fragment carried what the model generates — an id, a
// function name or argument text — rather than an index alone.
func (a *accumulator) mergeToolCalls(raw json.RawMessage) (named bool, err error) {
	var frags []toolCallDelta
	if err := json.Unmarshal(raw, &frags); err != nil {
		return false, fmt.Errorf("decode tool_calls delta: %w", err)
	}
	if a.calls == nil {
		a.calls = make(map[int]*toolCall)
		a.arguments = make(map[int]*strings.Builder)
	}
	for _, f := range frags {
		if f.Index == nil {
			return false, errors.New("tool_calls delta without index")
		}
		named = named || f.ID != "" || f.Function.Name != "" || f.Function.Arguments != ""
		i := *f.Index
		call, ok := a.calls[i]
		if !ok {
			call = &toolCall{}
			a.calls[i] = call
			a.arguments[i] = &strings.Builder{}
		}
		if call.ID == "" {
			call.ID = f.ID
		}
		if call.Type == "" {
			call.Type = f.Type
		}
		if call.Function.Name == "" {
			call.Function.Name = f.Function.Name
		}
		a.arguments[i].WriteString(f.Function.Arguments)
	}
	return named, nil
}

// outcome is the attempt's result so far.
func (a *accumulator) outcome() Outcome {
	out := Outcome{
		FinishReason: a.finish,
		Content:      a.content.String(),
		Refusal:      a.refusal.String(),
		ToolCalls:    a.toolCalls(),
		WellFormed:   a.finish != "" && a.done,
	}
	if a.finalUsage {
		out.Usage = schemas.Usage{InputUnits: a.promptTokens, OutputUnits: a.completionTokens}
		return out
	}
	out.Usage = schemas.Usage{InputUnits: a.inputEstimate, OutputUnits: a.tokens, Estimated: true}
	if a.sawPrompt {
		out.Usage.InputUnits = a.promptTokens
	}
	return out
}

// toolCalls renders the accumulated calls ordered by index.
func (a *accumulator) toolCalls() json.RawMessage {
	if len(a.calls) == 0 {
		return nil
	}
	idx := make([]int, 0, len(a.calls))
	for i := range a.calls {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	calls := make([]toolCall, len(idx))
	for n, i := range idx {
		calls[n] = *a.calls[i]
		calls[n].Function.Arguments = a.arguments[i].String()
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(calls) // strings and ints always encode
	return bytes.TrimRight(b.Bytes(), "\n")
}
