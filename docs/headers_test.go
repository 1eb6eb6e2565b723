package docs

import (
	"os"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/frontdoor"
)

// answerHeaders are the headers every answer of the HTTP door carries,
// with what the README's table must say of each value.
var answerHeaders = map[string]string{
	frontdoor.HeaderAttempts:                    "",
	frontdoor.HeaderHedged:                      "`true`",
	frontdoor.HeaderWinnerRoute:                 "",
	frontdoor.HeaderGate:                        "`group/attempt/epoch`",
	strings.ToLower(frontdoor.HeaderRequestID):  "the id of the group",
	strings.ToLower(frontdoor.HeaderXRequestID): "the id of the group",
}

// TestREADMEDocumentsTheAnswerHeaders fails for each header an answer
// carries that the README's table of them lacks, or whose value's format
// the row does not give; §6 gives the gate's too.
func TestREADMEDocumentsTheAnswerHeaders(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(readme), "\n") {
		if name, rest, ok := strings.Cut(strings.TrimPrefix(line, "| `"), "` | "); ok && strings.HasPrefix(line, "| `") {
			rows[name] = rest
		}
	}
	// One row may name several headers: "`request-id`, `x-request-id`".
	for name, rest := range rows {
		if first, other, ok := strings.Cut(name, "`, `"); ok {
			rows[first], rows[other] = rest, rest
		}
	}
	for name, format := range answerHeaders {
		row, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("the README's table of answer headers has no row for %s", name)
		case !strings.Contains(row, format):
			t.Errorf("the README's row for %s does not give its format %s: %s", name, format, row)
		}
	}
	arch, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "`" + frontdoor.HeaderGate + ": group/attempt/epoch`"; !strings.Contains(string(arch), want) {
		t.Errorf("docs/architecture.md §6 does not give %s", want)
	}
}
