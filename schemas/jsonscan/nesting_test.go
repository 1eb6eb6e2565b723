package jsonscan

import "testing"

func TestNestingCountsBracketsOutsideStringsOnly(t *testing.T) {
	tests := []struct {
		name                 string
		doc                  string
		wantDepth, wantBoxes int
	}{
		{"a scalar has no nesting", `42`, 0, 0},
		{"an empty object is depth one", `{}`, 1, 1},
		{"siblings count once each but add no depth", `{"a":[1,2],"b":{}}`, 2, 3},
		{"nesting adds depth", `{"a":{"b":{"c":[[]]}}}`, 5, 5},
		{"brackets inside strings are text", `{"a":"{[{[","b":"]}"}`, 1, 1},
		{"an escaped quote does not end a string", `{"a":"\"{{","b":[]}`, 2, 2},
		{"an escaped backslash ends before the quote", `["\\",{}]`, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			depth, boxes := Nesting([]byte(tt.doc))
			if depth != tt.wantDepth || boxes != tt.wantBoxes {
				t.Errorf("Nesting(%s) = depth %d, containers %d; want %d, %d", tt.doc, depth, boxes, tt.wantDepth, tt.wantBoxes)
			}
		})
	}
}

func TestStringEndFindsTheClosingQuote(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		open int
		want int
	}{
		{"an empty string", `""`, 0, 1},
		{"a string inside a document", `{"ab":1}`, 1, 4},
		{"an escaped quote does not close it", `"a\"b"`, 0, 5},
		{"an escaped backslash does not escape the quote", `"\\"x`, 0, 3},
		{"an unclosed string runs to the end", `"abc`, 0, 4},
		{"a trailing backslash runs to the end", `"a\`, 0, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := StringEnd([]byte(tt.doc), tt.open); got != tt.want {
				t.Errorf("StringEnd(%s, %d) = %d, want %d", tt.doc, tt.open, got, tt.want)
			}
		})
	}
}
