package redact

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestTextMasksPasswordsAndTokensInURLs(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"user and password keep the user", "nats://alice:s3cret@host:4222", "nats://alice:xxxxx@host:4222"},
		{"a token is masked whole", "nats://s3cret@host:4222", "nats://xxxxx@host:4222"},
		{"an empty user keeps its colon", "redis://:s3cret@host:6379/0", "redis://:xxxxx@host:6379/0"},
		{"a password holding @ is masked to the last @", "nats://alice:s3@cret@host", "nats://alice:xxxxx@host"},
		{"a path with @ after the host is left alone", "http://host/a@b", "http://host/a@b"},
		{"a URL without userinfo is unchanged", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"every URL inside a sentence is masked", `parse "nats://a:s3cret@h:bad": invalid port; also tls://b:s3cret@g`,
			`parse "nats://a:xxxxx@h:bad": invalid port; also tls://b:xxxxx@g`},
		{"a malformed scheme is still masked", "nats ://a:s3cret@host", "nats ://a:xxxxx@host"},
		{"a password holding a quote, as an error quotes it, is masked whole", `parse "redis://:\"s3cret@host": net/url: invalid userinfo`,
			`parse "redis://:xxxxx@host": net/url: invalid userinfo`},
		{"a password holding a single quote is masked whole", "redis://:s3'cret@host", "redis://:xxxxx@host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Text(tc.in); got != tc.want {
				t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestURLsMasksEachURL(t *testing.T) {
	got := URLs([]string{"nats://a:s3cret@h1:4222", "nats://h2:4222", "nats://tok3n@h3"})
	if want := "nats://a:xxxxx@h1:4222,nats://h2:4222,nats://xxxxx@h3"; got != want {
		t.Errorf("URLs = %q, want %q", got, want)
	}
}

func TestErrorMasksTheParseErrorOfAURLAndStillUnwraps(t *testing.T) {
	_, perr := url.Parse("nats://alice:s3cret@host:bad")
	if !strings.Contains(perr.Error(), "s3cret") {
		t.Fatalf("url.Parse no longer quotes the URL (%v): this test needs a new leaking error", perr)
	}
	err := Error(perr)
	if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "alice:xxxxx@host") {
		t.Errorf("Error text %q", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Error("the masked error does not unwrap to the *url.Error")
	}
	plain := errors.New("no credentials here")
	if Error(plain) != plain || Error(nil) != nil {
		t.Error("an error without userinfo is not returned as is")
	}
}
