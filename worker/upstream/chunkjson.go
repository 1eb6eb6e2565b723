package upstream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
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
	p := chunkParser{data: data}
	if p.chunk(c) {
		return nil
	}
	*c = chatCompletionChunk{}
	return json.Unmarshal(data, c)
}

// maxFastDepth is the nesting the fast pass follows; deeper input goes to
// encoding/json, which has its own (larger) limit.
const maxFastDepth = 64

// chunkParser is the fast pass of decodeChunk: a strict JSON reader over
// one document. Every method returns false to decline the input.
type chunkParser struct {
	data []byte
	i    int
}

// Field names, at each level of a chunk, that the adapter reads.
var (
	chunkFields  = [...]string{"choices", "usage", "error"}
	choiceFields = [...]string{"index", "delta", "finish_reason"}
	deltaFields  = [...]string{"content", "refusal", "tool_calls"}
	usageFields  = [...]string{"prompt_tokens", "completion_tokens"}
)

func (p *chunkParser) chunk(c *chatCompletionChunk) bool {
	var seen [len(chunkFields)]bool
	ok := p.object(func(key []byte) bool {
		f := fieldIndex(key, chunkFields[:])
		switch {
		case f == -1:
			return p.skip(1)
		case f < 0 || seen[f]:
			return false
		}
		seen[f] = true
		switch f {
		case 0:
			return p.choices(c)
		case 1:
			return p.usage(c)
		default:
			raw, ok := p.raw(1)
			c.Error = raw
			return ok
		}
	})
	if !seen[0] {
		c.Choices = nil // absent, as encoding/json leaves it
	}
	return ok && p.end()
}

func (p *chunkParser) choices(c *chatCompletionChunk) bool {
	if p.null() {
		c.Choices = nil
		return true
	}
	if p.peek() != '[' {
		return false
	}
	p.i++
	c.Choices = c.Choices[:0]
	if p.peek() == ']' {
		p.i++
		c.Choices = []chunkChoice{} // as encoding/json: empty, not nil
		return true
	}
	for {
		c.Choices = append(c.Choices, chunkChoice{})
		if !p.choice(&c.Choices[len(c.Choices)-1]) {
			return false
		}
		switch p.peek() {
		case ',':
			p.i++
		case ']':
			p.i++
			return true
		default:
			return false
		}
	}
}

func (p *chunkParser) choice(ch *chunkChoice) bool {
	var seen [len(choiceFields)]bool
	return p.object(func(key []byte) bool {
		f := fieldIndex(key, choiceFields[:])
		switch {
		case f == -1:
			return p.skip(2)
		case f < 0 || seen[f]:
			return false
		}
		seen[f] = true
		switch f {
		case 0:
			if p.null() {
				return true
			}
			n, ok := p.integer()
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
	var seen [len(deltaFields)]bool
	return p.object(func(key []byte) bool {
		f := fieldIndex(key, deltaFields[:])
		switch {
		case f == -1:
			return p.skip(3)
		case f < 0 || seen[f]:
			return false
		}
		seen[f] = true
		switch f {
		case 0:
			return p.optString(&d.Content, &d.content)
		case 1:
			return p.optString(&d.Refusal, &d.refusal)
		default:
			raw, ok := p.raw(3)
			d.ToolCalls = raw
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
	var seen [len(usageFields)]bool
	return p.object(func(key []byte) bool {
		f := fieldIndex(key, usageFields[:])
		switch {
		case f == -1:
			return p.skip(2)
		case f < 0 || seen[f]:
			return false
		}
		seen[f] = true
		if p.null() {
			return true
		}
		n, ok := p.integer()
		if f == 0 {
			u.PromptTokens = n
		} else {
			u.CompletionTokens = n
		}
		return ok
	})
}

// fieldIndex is the index of key in names, -1 when key is none of them, or
// -2 when encoding/json might still match it to one of them: an escaped
// key, invalid UTF-8, or a case-insensitive match.
func fieldIndex(key []byte, names []string) int {
	plain := true // ASCII without escapes: folds only to a name of its length
	for _, c := range key {
		if c >= utf8.RuneSelf || c == '\\' {
			plain = false
			break
		}
	}
	folds := false
	for i, n := range names {
		if len(n) == len(key) {
			if string(key) == n {
				return i
			}
			folds = folds || plain && bytes.EqualFold(key, []byte(n))
		}
	}
	if plain {
		if folds {
			return -2
		}
		return -1
	}
	if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
		return -2
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return -2
		}
	}
	return -1
}

// object reads an object, calling field with each key once the reader
// stands at the key's value; field reads the value.
func (p *chunkParser) object(field func(key []byte) bool) bool {
	if p.peek() != '{' {
		return false
	}
	p.i++
	if p.peek() == '}' {
		p.i++
		return true
	}
	for {
		if p.peek() != '"' {
			return false
		}
		key, _, ok := p.stringBody()
		if !ok || p.peek() != ':' {
			return false
		}
		p.i++
		if !field(key) {
			return false
		}
		switch p.peek() {
		case ',':
			p.i++
		case '}':
			p.i++
			return true
		default:
			return false
		}
	}
}

// optString reads a string or null into a *string field, pointing it at
// store, which lives as long as the field.
func (p *chunkParser) optString(dst **string, store *string) bool {
	if p.null() {
		*dst = nil
		return true
	}
	if p.peek() != '"' {
		return false
	}
	start := p.i
	body, escaped, ok := p.stringBody()
	if !ok {
		return false
	}
	if !escaped && utf8.Valid(body) {
		*store = string(body)
	} else if json.Unmarshal(p.data[start:p.i], store) != nil {
		// Escapes and invalid UTF-8 are rare: encoding/json decodes them.
		return false
	}
	*dst = store
	return true
}

// integer reads a JSON number with neither fraction nor exponent that fits
// an int64, as encoding/json decodes into an integer field.
func (p *chunkParser) integer() (int64, bool) {
	start := p.i
	if !p.number() {
		return 0, false
	}
	lit := p.data[start:p.i]
	if bytes.ContainsAny(lit, ".eE") {
		return 0, false
	}
	n, err := strconv.ParseInt(string(lit), 10, 64)
	return n, err == nil
}

// raw reads any value and returns a copy of its text, as json.RawMessage
// keeps it.
func (p *chunkParser) raw(depth int) (json.RawMessage, bool) {
	p.ws()
	start := p.i
	if !p.skip(depth) {
		return nil, false
	}
	return append(json.RawMessage(nil), p.data[start:p.i]...), true
}

// skip reads and validates any value.
func (p *chunkParser) skip(depth int) bool {
	if depth > maxFastDepth {
		return false
	}
	switch p.peek() {
	case '{':
		return p.object(func([]byte) bool { return p.skip(depth + 1) })
	case '[':
		p.i++
		if p.peek() == ']' {
			p.i++
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			switch p.peek() {
			case ',':
				p.i++
			case ']':
				p.i++
				return true
			default:
				return false
			}
		}
	case '"':
		_, _, ok := p.stringBody()
		return ok
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		return p.number()
	}
}

// null reads a null if one is next.
func (p *chunkParser) null() bool {
	return p.peek() == 'n' && p.literal("null")
}

func (p *chunkParser) literal(lit string) bool {
	if !bytes.HasPrefix(p.data[p.i:], []byte(lit)) {
		return false
	}
	p.i += len(lit)
	return true
}

// stringBody reads a string, the reader standing at its opening quote, and
// returns the text between the quotes, still escaped, and whether it has
// escapes.
func (p *chunkParser) stringBody() (body []byte, escaped, ok bool) {
	p.i++
	start := p.i
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			body = p.data[start:p.i]
			p.i++
			return body, escaped, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			escaped = true
			p.i++
			if p.i >= len(p.data) {
				return nil, false, false
			}
			switch p.data[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i++
			case 'u':
				if p.i+5 > len(p.data) {
					return nil, false, false
				}
				for _, h := range p.data[p.i+1 : p.i+5] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				p.i += 5
			default:
				return nil, false, false
			}
		default:
			p.i++
		}
	}
	return nil, false, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number reads a number as the JSON grammar defines it.
func (p *chunkParser) number() bool {
	d := p.data
	i := p.i
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	p.i = i
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// ws skips whitespace.
func (p *chunkParser) ws() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, 0 at the end.
func (p *chunkParser) peek() byte {
	p.ws()
	if p.i < len(p.data) {
		return p.data[p.i]
	}
	return 0
}

// end reports that only whitespace follows.
func (p *chunkParser) end() bool {
	p.ws()
	return p.i == len(p.data)
}
