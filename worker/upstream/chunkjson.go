package upstream

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/hedgerow/hedgerow/schemas/jsonscan"
)

// decodeChunk decodes one chat.completion.chunk into c, which must be zero
// apart from the backing array of c.Choices, which it reuses.
//
// A provider streams a score of chunks per answer, and encoding/json spends
// most of its time on the fields the adapter never reads (id, model,
// system_fingerprint, logprobs...) and on reflection. So decodeChunk first
// tries one pass that reads the fields it needs and validates the rest
// without decoding it. That pass declines every input it does not handle
// exactly as encoding/json would — invalid JSON, escaped or case-folded
// keys, a field given twice, a value of an unexpected type — and such input
// goes to json.Unmarshal, so the result and every error are those of
// json.Unmarshal on any input.
func decodeChunk(data []byte, c *chatCompletionChunk) error {
	p := chunkParser{jsonscan.Scanner{Data: data}}
	if p.chunk(c) {
		return nil
	}
	*c = chatCompletionChunk{}
	return json.Unmarshal(data, c)
}

// chunkParser is the fast pass of decodeChunk: a strict JSON reader over
// one document. Every method returns false to decline the input.
type chunkParser struct{ jsonscan.Scanner }

// Field names, at each level of a chunk, that the adapter reads.
var (
	chunkFields  = [...]string{"choices", "usage", "error"}
	choiceFields = [...]string{"index", "delta", "finish_reason"}
	deltaFields  = [...]string{"content", "refusal", "tool_calls", "reasoning_content", "reasoning"}
	usageFields  = [...]string{"prompt_tokens", "completion_tokens"}
)

// fields reads an object, calling field with the index in names of each key
// it names, the reader standing at the key's value, and skipping the values
// of other keys at depth. It declines a key given twice and one FieldIndex
// cannot place for sure, which encoding/json reads its own way.
func (p *chunkParser) fields(names []string, depth int, field func(f int) bool) bool {
	var seen uint32 // bit f: names[f] was read
	return p.Object(func(key []byte) bool {
		f := jsonscan.FieldIndex(key, names)
		switch {
		case f == -1:
			return p.Skip(depth)
		case f < 0 || seen&(1<<f) != 0:
			return false
		}
		seen |= 1 << f
		return field(f)
	})
}

func (p *chunkParser) chunk(c *chatCompletionChunk) bool {
	hasChoices := false
	ok := p.fields(chunkFields[:], 1, func(f int) bool {
		switch f {
		case 0:
			hasChoices = true
			return p.choices(c)
		case 1:
			return p.usage(c)
		default:
			raw, ok := p.raw(1)
			c.Error = raw
			return ok
		}
	})
	if !hasChoices {
		c.Choices = nil // absent, as encoding/json leaves it
	}
	return ok && p.End()
}

func (p *chunkParser) choices(c *chatCompletionChunk) bool {
	if p.null() {
		c.Choices = nil
		return true
	}
	if p.Peek() != '[' {
		return false
	}
	p.I++
	c.Choices = c.Choices[:0]
	if p.Peek() == ']' {
		p.I++
		c.Choices = []chunkChoice{} // as encoding/json: empty, not nil
		return true
	}
	for {
		c.Choices = append(c.Choices, chunkChoice{})
		if !p.choice(&c.Choices[len(c.Choices)-1]) {
			return false
		}
		switch p.Peek() {
		case ',':
			p.I++
		case ']':
			p.I++
			return true
		default:
			return false
		}
	}
}

func (p *chunkParser) choice(ch *chunkChoice) bool {
	return p.fields(choiceFields[:], 2, func(f int) bool {
		switch f {
		case 0:
			if p.null() {
				return true
			}
			n, ok := p.Integer()
			ch.Index = int(n)
			return ok && int64(ch.Index) == n
		case 1:
			if p.null() {
				return true
			}
			return p.delta(&ch.Delta)
		default:
			return p.optString(&ch.FinishReason, &ch.finishReason)
		}
	})
}

func (p *chunkParser) delta(d *chunkDelta) bool {
	return p.fields(deltaFields[:], 3, func(f int) bool {
		switch f {
		case 0:
			return p.optString(&d.Content, &d.content)
		case 1:
			return p.optString(&d.Refusal, &d.refusal)
		default:
			raw, ok := p.raw(3)
			switch f {
			case 2:
				d.ToolCalls = raw
			case 3:
				d.ReasoningContent = raw
			default:
				d.Reasoning = raw
			}
			return ok
		}
	})
}

func (p *chunkParser) usage(c *chatCompletionChunk) bool {
	if p.null() {
		c.Usage = nil
		return true
	}
	u := new(chunkUsage)
	c.Usage = u
	return p.fields(usageFields[:], 2, func(f int) bool {
		if p.null() {
			return true
		}
		n, ok := p.Integer()
		if f == 0 {
			u.PromptTokens = n
		} else {
			u.CompletionTokens = n
		}
		return ok
	})
}

// optString reads a string or null into a *string field, pointing it at
// store, which lives as long as the field.
func (p *chunkParser) optString(dst **string, store *string) bool {
	if p.null() {
		*dst = nil
		return true
	}
	if p.Peek() != '"' {
		return false
	}
	start := p.I
	body, escaped, ok := p.StringBody()
	if !ok {
		return false
	}
	if !escaped && utf8.Valid(body) {
		*store = string(body)
	} else if json.Unmarshal(p.Data[start:p.I], store) != nil {
		// Escapes and invalid UTF-8 are rare: encoding/json decodes them.
		return false
	}
	*dst = store
	return true
}

// raw reads any value and returns a copy of its text, as json.RawMessage
// keeps it.
func (p *chunkParser) raw(depth int) (json.RawMessage, bool) {
	p.WS()
	start := p.I
	if !p.Skip(depth) {
		return nil, false
	}
	return append(json.RawMessage(nil), p.Data[start:p.I]...), true
}

// null reads a null if one is next.
func (p *chunkParser) null() bool {
	return p.Peek() == 'n' && p.Literal("null")
}
