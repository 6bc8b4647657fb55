package consul

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk/backoff"
)

// Retry timing after a failed request.
const (
	retryBase = 250 * time.Millisecond
	retryMax  = 10 * time.Second
	// retryJitter spreads the retries of watches that failed together
	// (an agent restart fails every one of them at once).
	retryJitter = 0.5
	// loopInterval is the least time between two requests of one watch
	// loop, so a service that changes all the time cannot spin it.
	loopInterval = 100 * time.Millisecond
	// peerListInterval is how often a peer's imported service names are
	// asked for: Consul has no blocking query for them.
	peerListInterval = 2 * time.Second
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

// newBackoff returns the retry timing of one watch loop.
func newBackoff() backoff.Backoff {
	return backoff.Backoff{Base: retryBase, Max: retryMax, Jitter: retryJitter}
}

// explain adds the cause of a failed HTTPS request when the transport hid
// it. With TLS 1.3 an agent that refuses the client's certificate says so
// only after the handshake; when its alert closes the connection before
// Go's HTTP/2 client has sent the first request, the client reports no
// more than that the connection "could not be established" (on a busy
// machine, every time). One HTTP/1.1 request with the same TLS settings
// gets the agent's alert. Errors that already name their cause (network,
// certificate checks, TLS records, HTTP statuses) pass unchanged.
func (r *run) explain(ctx context.Context, err error) error {
	var (
		ue     *url.Error
		ne     net.Error
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
	)
	if r.s.tls == nil || ctx.Err() != nil || !errors.As(err, &ue) ||
		errors.As(ue.Err, &ne) || errors.As(ue.Err, &verify) || errors.As(ue.Err, &record) {
		return err // (*url.Error is a net.Error itself, so look inside it)
	}
	host := strings.TrimPrefix(r.s.api.Address, "https://")
	if strings.Contains(host, "://") {
		return err // a unix socket
	}
	if perr := probeHTTP1(ctx, r.s.tls, host); perr != nil {
		return fmt.Errorf("%w (over HTTP/1.1: %w)", err, perr)
	}
	return err
}

// probeHTTP1 asks the agent for its leader over HTTP/1.1 and returns what
// failed, or nil.
func probeHTTP1(ctx context.Context, conf *tls.Config, host string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conf = conf.Clone()
	conf.NextProtos = []string{"http/1.1"}
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment, TLSClientConfig: conf, DisableKeepAlives: true,
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}, // no HTTP/2
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+"/v1/status/leader", nil)
	if err != nil {
		return err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
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
		// Keep what was said around the request's error, such as the
		// cause explain found over HTTP/1.1: on a busy machine it is the
		// only place the agent's TLS alert appears.
		if rest, ok := strings.CutPrefix(err.Error(), ue.Error()); ok {
			msg += rest
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			msg = "cannot reach the agent: " + msg
		}
		return msg
	}
	return err.Error()
}
