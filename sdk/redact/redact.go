// Package redact keeps credentials out of what operators see: logs, health
// messages, debug pages and command output. The host and every plugin use
// it, so a URL's `user:password@` or a token is hidden the same way
// everywhere.
//
// Two kinds of secret are handled. Credentials inside URLs are found by
// their shape (scheme://USERINFO@host) wherever they appear in a text, as
// an error from net/http quotes them. Values known to be secret, such as
// the attributes a plugin's schema marks sensitive, are registered in a
// [Secrets] set and replaced wherever they appear.
package redact

import (
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Placeholder replaces a URL's user information and every registered
// secret value.
const Placeholder = "redacted"

// URL returns raw with its user information (user name and password, or a
// token in the user name) replaced by [Placeholder]. A string that is not
// a URL with user information is returned unchanged.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		// An unparsable URL may still carry credentials: the textual
		// rule below finds them.
		return Text(raw)
	}
	u.User = url.User(Placeholder)
	return u.String()
}

// userinfo matches "scheme://USERINFO@" in free text. USERINFO stops at
// what cannot be part of it in a URL's authority (/ ? #), at white space
// and at quotes, so that "user@example.com" outside a URL and a second URL
// later in the text are left alone.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s"'<>@]+@`)

// Text replaces the user information of every URL in s (as in
// `Get "https://user:pass@host/api": EOF`) by [Placeholder].
func Text(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return userinfo.ReplaceAllString(s, "${1}"+Placeholder+"@")
}

// MinSecretLen is the shortest value a [Secrets] set replaces in free
// text: shorter ones would mangle every log line that happens to contain
// them. Views built from a schema (/debug/configz) hide sensitive values
// of any length.
const MinSecretLen = 4

// Secrets is a set of values to hide, safe for concurrent use. Values are
// only ever added: a token replaced on reload may still appear in what the
// plugin that held it says on its way out. The zero value is an empty set.
type Secrets struct {
	mu       sync.RWMutex
	values   []string
	replacer *strings.Replacer
}

// Add registers values. Values shorter than [MinSecretLen] are ignored.
// Each is also registered in its JSON-escaped form, so that JSON logs,
// which escape quotes and backslashes, are covered too.
func (s *Secrets) Add(values ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, v := range values {
		if len(v) < MinSecretLen {
			continue
		}
		forms := []string{v}
		if b, err := json.Marshal(v); err == nil {
			if esc := string(b[1 : len(b)-1]); esc != v {
				forms = append(forms, esc)
			}
		}
		for _, f := range forms {
			if !slices.Contains(s.values, f) {
				s.values = append(s.values, f)
				changed = true
			}
		}
	}
	if !changed {
		return
	}
	// Longest first: a secret that contains another is replaced whole.
	slices.SortFunc(s.values, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(s.values))
	for _, v := range s.values {
		pairs = append(pairs, v, Placeholder)
	}
	s.replacer = strings.NewReplacer(pairs...)
}

// String returns in with every registered value, and every URL's user
// information, replaced by [Placeholder].
func (s *Secrets) String(in string) string {
	if s == nil {
		return Text(in)
	}
	s.mu.RLock()
	r := s.replacer
	s.mu.RUnlock()
	if r != nil {
		in = r.Replace(in)
	}
	return Text(in)
}

// Writer returns a writer that redacts what it writes to w, for a logger's
// output. Each Write is redacted on its own: hclog writes a whole line at
// a time, so a secret is never split between two writes.
func (s *Secrets) Writer(w io.Writer) io.Writer { return &writer{s: s, w: w} }

type writer struct {
	s *Secrets
	w io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.w, w.s.String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
