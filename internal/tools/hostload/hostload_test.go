package hostload

import "testing"

func TestAveragesKeepTheThreeAverages(t *testing.T) {
	for line, want := range map[string]string{
		"2.31 1.95 1.80 3/412 90210\n": "2.31 1.95 1.80",
		"0.00 0.01":                    "0.00 0.01",
		"":                             "",
	} {
		if got := averages(line); got != want {
			t.Errorf("averages(%q) = %q, want %q", line, got, want)
		}
	}
}

func TestOneMinuteIsTheFirstAverageAndABadLineIsAnError(t *testing.T) {
	tests := []struct {
		line string
		want float64
		ok   bool
	}{
		{"2.31 1.95 1.80 3/412 90210\n", 2.31, true},
		{"0.00", 0, true},
		{"", 0, false},
		{"busy 1.0 1.0", 0, false},
	}
	for _, tt := range tests {
		got, err := oneMinute(tt.line)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("oneMinute(%q) = %v, %v; want %v, ok %v", tt.line, got, err, tt.want, tt.ok)
		}
	}
}
