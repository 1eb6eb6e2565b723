package schemas

import (
	"encoding/json"
	"testing"
)

func TestAttemptSecretsAre128RandomBitsThatTheSchemaAccepts(t *testing.T) {
	seen := make(map[string]bool)
	for range 64 {
		s, err := NewAttemptSecret()
		if err != nil {
			t.Fatal(err)
		}
		if len(s) != 2*SecretBytes || SecretBytes < 16 {
			t.Fatalf("secret %d hex digits, want %d (≥ 128 bits)", len(s), 2*SecretBytes)
		}
		if seen[s] {
			t.Fatal("a secret repeated")
		}
		seen[s] = true
		data, err := json.Marshal(Cancel{GroupID: "g1", Attempt: 1, Reason: CancelLostRace, Secret: s})
		if err != nil {
			t.Fatal(err)
		}
		if err := Validate(KindCancel, data); err != nil {
			t.Fatalf("cancel with a fresh secret: %v", err)
		}
	}
}

func TestSameSecretMatchesOnlyTheWholeSecret(t *testing.T) {
	const want = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name string
		got  string
		same bool
	}{
		{"identical", want, true},
		{"empty", "", false},
		{"prefix", want[:31], false},
		{"longer", want + "0", false},
		{"last digit differs", want[:31] + "e", false},
		{"upper case", "0123456789ABCDEF0123456789ABCDEF", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if SameSecret(want, tc.got) != tc.same {
				t.Fatalf("SameSecret(want, %q) = %v", tc.got, !tc.same)
			}
		})
	}
	if !SameSecret("", "") {
		t.Fatal("an attempt without a secret (an older gateway's) must match a cancel without one")
	}
}

func TestDecodeReplyReadsTheSenderOfEveryReplyType(t *testing.T) {
	const secret = "9f86d081884c7d659a2feaa0c55ad015"
	for _, m := range []json.Marshaler{
		Accept{GroupID: "g", Attempt: 1, WorkerID: "w", ControlInbox: "c", Secret: secret},
		Busy{GroupID: "g", Attempt: 1, WorkerID: "w", Secret: secret},
		Heartbeat{GroupID: "g", Attempt: 1, Seq: 1, WorkerID: "w", Secret: secret},
		FirstByte{GroupID: "g", Attempt: 1, WorkerID: "w", Secret: secret},
		Chunk{GroupID: "g", Attempt: 1, Seq: 1, WorkerID: "w", Secret: secret},
		AttemptResult{GroupID: "g", Attempt: 1, WorkerID: "w", Secret: secret},
	} {
		data, err := m.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		r, err := DecodeReply(data)
		if err != nil {
			t.Fatal(err)
		}
		if w, s := r.Sender(); w != "w" || s != secret {
			t.Errorf("%s: Sender() = %q, secret of %d bytes", r.ReplyType(), w, len(s))
		}
	}
}
