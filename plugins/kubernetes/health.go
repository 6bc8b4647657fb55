package kubernetes

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"k8s.io/client-go/tools/cache"

	"github.com/estuary-mesh/estuary/sdk"
)

// An instance's health follows the API server's answers to its informers'
// requests, plus the notices about single objects (dropped gateways,
// refused secrets).

// maxNotices bounds the notices of one instance: a secret namespace full of
// broken secrets must not make every health event huge.
const maxNotices = 100

// observer reports every API response to the cluster's health tracking.
type observer struct {
	next    http.RoundTripper
	observe func(*http.Request, *http.Response, error)
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.next.RoundTrip(req)
	o.observe(req, resp, err)
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport underneath.
func (o *observer) WrappedRoundTripper() http.RoundTripper { return o.next }

// observe records the outcome of one request. Each request path (one per
// informer) keeps its last outcome: the cluster is healthy when none failed.
func (c *cluster) observe(req *http.Request, resp *http.Response, err error) {
	var failure string
	switch {
	case err != nil:
		if req.Context().Err() != nil {
			return // cancelled by us
		}
		failure = err.Error()
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden ||
		resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		// 429 too: an API server that keeps throttling the plugin's
		// lists leaves it as far behind as one that fails them.
		failure = fmt.Sprintf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if old, ok := c.failures[req.URL.Path]; ok && old == failure {
		return
	}
	c.failures[req.URL.Path] = failure
	c.publishHealthLocked()
}

// onWatchError is called when an informer's list or watch fails. The
// failed request itself was reported to observe; this only logs.
func (c *cluster) onWatchError(r *cache.Reflector, err error) {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if !stopped && c.ctx.Err() == nil {
		c.log.Warn("list/watch failed; retrying with backoff", "server", c.server, "error", err)
	}
}

func (c *cluster) setGatewayNotices(n []sdk.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gwNotices = n
	c.publishHealthLocked()
}

// noteService keeps the problem with one service's annotations, or
// forgets it (err nil), and republishes health when that changed.
func (c *cluster) noteService(namespace, name string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := namespace + "/" + name
	_, had := c.svcNotices[key]
	if err == nil {
		if had {
			delete(c.svcNotices, key)
			c.publishHealthLocked()
		}
		return
	}
	n := sdk.Notice{Subject: "Service " + key, Message: err.Error()}
	if had && c.svcNotices[key] == n {
		return
	}
	if c.svcNotices == nil {
		c.svcNotices = map[string]sdk.Notice{}
	}
	c.svcNotices[key] = n
	c.publishHealthLocked()
}

// setExtraNotices sets notices others report about this instance.
func (c *cluster) setExtraNotices(n []sdk.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.extra = n
	c.publishHealthLocked()
}

// publishHealthLocked sends the instance's health. Caller holds c.mu.
func (c *cluster) publishHealthLocked() {
	if !c.activated || c.stopped {
		return
	}
	h := sdk.InstanceHealth{Healthy: true}
	var failed []string
	for _, p := range slices.Sorted(maps.Keys(c.failures)) {
		if f := c.failures[p]; f != "" && !slices.Contains(failed, f) {
			failed = append(failed, f)
		}
	}
	switch {
	case len(failed) > 0 && (c.published || c.inherited):
		h.Healthy = false
		h.Message = fmt.Sprintf("disconnected from API server %s, serving the last-known state: %s", c.server, strings.Join(failed, "; "))
	case len(failed) > 0:
		h.Healthy = false
		h.Message = fmt.Sprintf("cannot sync with API server %s: %s", c.server, strings.Join(failed, "; "))
	case !c.published && c.inherited:
		h.Message = "syncing with API server " + c.server + " with a new kubeconfig; serving the last-known state meanwhile"
	case !c.published:
		h.Message = "syncing with API server " + c.server
	}
	capped := sdk.NoticeList{Max: maxNotices, Subject: "cluster " + c.id.Cluster}
	capped.Add(c.extra...)
	capped.Add(c.gwNotices...)
	for _, k := range slices.Sorted(maps.Keys(c.svcNotices)) {
		capped.Add(c.svcNotices[k])
	}
	capped.Add(c.mcsNotice...)
	h.Notices = capped.List()
	if err := c.state.SetHealth(c.id, h); err != nil {
		c.log.Error("set health", "error", err)
	}
}
