package xdsload

import (
	"context"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
)

// sotw runs one State of the World stream until it ends. It subscribes to
// every cluster (a wildcard: no names) and then to the CLAs of the EDS
// clusters it watches. Every request for a type carries the version the
// client last accepted and the nonce of the last response it saw, so an
// ACK names the new version and a NACK the old one.
func (c *Client) sotw(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	var cdsVersion, edsVersion, edsNonce string
	var watched []string
	edsRequest := func(version, nonce string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: watched, VersionInfo: version, ResponseNonce: nonce}
	}
	first := &discoveryv3.DiscoveryRequest{Node: c.f.opts.node(c.index), TypeUrl: resourcev3.ClusterType}
	handle := func(st grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], resp *discoveryv3.DiscoveryResponse, at time.Time) (*discoveryv3.DiscoveryRequest, error) {
		version, nonce := resp.GetVersionInfo(), resp.GetNonce()
		sameVersion := func(int) string { return version }
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			set, err := c.nextClusters(true, resp.GetResources(), sameVersion, nil)
			if err != nil {
				return &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: cdsVersion, ResponseNonce: nonce, ErrorDetail: c.nack(err)}, nil
			}
			if w, changed := c.applyClusters(set, at); changed {
				// Ask for the new clusters' endpoints before ACKing
				// the clusters, as Envoy's paused EDS resumes first.
				watched = w
				if err := st.Send(edsRequest(edsVersion, edsNonce)); err != nil {
					return nil, err
				}
			}
			cdsVersion = version
			return &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: version, ResponseNonce: nonce}, nil
		case resourcev3.EndpointType:
			edsNonce = nonce
			ups, err := c.decodeEndpoints(resp.GetResources())
			if err != nil {
				nack := edsRequest(edsVersion, nonce)
				nack.ErrorDetail = c.nack(err)
				return nack, nil
			}
			c.applyEndpoints(ups, sameVersion, nil, at)
			edsVersion = version
			return edsRequest(version, nonce), nil
		}
		return &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: nonce, ErrorDetail: c.nack(errUnasked(resp.GetTypeUrl()))}, nil
	}
	return converse(ctx, c, ads.StreamAggregatedResources, first, handle)
}
