package xdsload

import (
	"context"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// delta runs one incremental stream until it ends. It subscribes to every
// cluster (a legacy wildcard: no names) and then, as the cluster set
// changes, subscribes to and unsubscribes from CLAs. A response is ACKed or
// NACKed by its nonce.
func (c *Client) delta(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	var watched []string
	first := &discoveryv3.DeltaDiscoveryRequest{Node: c.f.opts.node(c.index), TypeUrl: resourcev3.ClusterType}
	handle := func(st grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], resp *discoveryv3.DeltaDiscoveryResponse, at time.Time) (*discoveryv3.DeltaDiscoveryRequest, error) {
		res := resp.GetResources()
		anys := make([]*anypb.Any, len(res))
		for i, r := range res {
			anys[i] = r.GetResource()
		}
		versions := func(i int) string { return res[i].GetVersion() }
		reply := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			set, err := c.nextClusters(false, anys, versions, resp.GetRemovedResources())
			if err != nil {
				reply.ErrorDetail = c.nack(err)
				break
			}
			if w, changed := c.applyClusters(set, at); changed {
				sub, unsub := diffSorted(watched, w)
				watched = w
				if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub}); err != nil {
					return nil, err
				}
			}
		case resourcev3.EndpointType:
			ups, err := c.decodeEndpoints(anys)
			if err != nil {
				reply.ErrorDetail = c.nack(err)
				break
			}
			c.applyEndpoints(ups, versions, resp.GetRemovedResources(), at)
		default:
			reply.ErrorDetail = c.nack(errUnasked(resp.GetTypeUrl()))
		}
		return reply, nil
	}
	return converse(ctx, c, ads.DeltaAggregatedResources, first, handle)
}

// diffSorted returns what is in next and not in prev, and what is in prev
// and not in next; both must be sorted.
func diffSorted(prev, next []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		switch {
		case j == len(next) || (i < len(prev) && prev[i] < next[j]):
			removed = append(removed, prev[i])
			i++
		case i == len(prev) || next[j] < prev[i]:
			added = append(added, next[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}
