package consul

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
)

// Retry timing after a failed request.
const (
	retryBase = 250 * time.Millisecond
	retryMax  = 10 * time.Second
	// loopInterval is the least time between two requests of one watch
	// loop, so a service that changes all the time cannot spin it.
	loopInterval = 100 * time.Millisecond
)

// nextIndex applies Consul's rules for blocking-query indexes: prev is the
// index the query waited on, got the X-Consul-Index of its answer. An index
// that went backwards (a snapshot restore, another server) means the answer
// cannot be trusted as a delta: reset is true, next is 0 and the caller
// lists afresh. An index of 0 becomes 1, so the next query blocks instead of
// returning at once.
func nextIndex(prev, got uint64) (next uint64, reset bool) {
	switch {
	case got < prev:
		return 0, true
	case got == 0:
		return 1, false
	}
	return got, false
}

// backoff is exponential with equal jitter (half fixed, half random) and a
// cap, so watchers that failed together do not retry together.
type backoff struct {
	n int
}

func (b *backoff) next() time.Duration {
	d := retryBase << min(b.n, 16)
	if d > retryMax || d <= 0 {
		d = retryMax
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.n = 0 }

// sleep waits d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// statusCode returns the HTTP status of a Consul error, or 0.
func statusCode(err error) int {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// describe explains a failed request to an operator, in one stable line
// (no query indexes, so it does not change from one retry to the next).
// Requests carry the token in a header, so no error text can hold it.
func describe(err error) string {
	var se api.StatusError
	if errors.As(err, &se) {
		body := se.Body
		if i := strings.IndexByte(body, '\n'); i >= 0 {
			body = body[:i]
		}
		if len(body) > 200 {
			body = body[:200] + "..."
		}
		status := fmt.Sprintf("HTTP %d %s: %s", se.Code, http.StatusText(se.Code), body)
		switch {
		case se.Code == http.StatusForbidden:
			return "permission denied (" + status + "); check token or token_file: the token needs service:read and node:read"
		case se.Code == http.StatusTooManyRequests:
			return "the agent is limiting this client (" + status + "); raise the agent's limits.http_max_conns_per_client above max_watchers, or lower max_watchers"
		case se.Code >= 500:
			return "Consul failed (" + status + ")"
		}
		return status
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		path := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			path = u.Host + u.Path
		}
		msg := fmt.Sprintf("%s %s: %v", ue.Op, path, ue.Err)
		if errors.Is(err, syscall.ECONNREFUSED) {
			msg = "cannot reach the agent: " + msg
		}
		return msg
	}
	return err.Error()
}
