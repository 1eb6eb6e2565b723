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
