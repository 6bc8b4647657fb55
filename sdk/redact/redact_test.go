package redact

import (
	"bytes"
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	tests := []struct{ in, want string }{
		{`Get "https://user:pass@host:6443/api": EOF`, `Get "https://redacted@host:6443/api": EOF`},
		{"https://token@h/x and http://a:b@c", "https://redacted@h/x and http://redacted@c"},
		{"mail user@example.com", "mail user@example.com"},
		{"https://host/path@v1", "https://host/path@v1"},
		{"no url", "no url"},
	}
	for _, tt := range tests {
		if got := Text(tt.in); got != tt.want {
			t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := URL("https://u:p@h:1/x?y=1"); got != "https://redacted@h:1/x?y=1" {
		t.Errorf("URL = %q", got)
	}
}

func TestSecrets(t *testing.T) {
	var s Secrets
	s.Add("abc", `tok"en-1234`, "tok") // "abc" and "tok" are too short
	in := `a token tok"en-1234 in {"t":"tok\"en-1234"} abc`
	want := `a token redacted in {"t":"redacted"} abc`
	if got := s.String(in); got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	var buf bytes.Buffer
	w := s.Writer(&buf)
	line := []byte("x tok\"en-1234 https://a:b@h\n")
	if n, err := w.Write(line); err != nil || n != len(line) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := buf.String(); strings.Contains(got, "1234") || strings.Contains(got, "a:b") {
		t.Errorf("written %q", got)
	}
}
