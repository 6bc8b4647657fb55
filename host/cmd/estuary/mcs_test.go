package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed"
)

// edsOnce opens an ADS stream as node id with CLUSTER_ID cluster, asks for
// the named EDS clusters and renders what the first answer holds, one
// string per endpoint: "ADDR:PORT HEALTH [+OTHER,...]", sorted, by cluster.
func edsOnce(t *testing.T, xdsAddr, id, cluster string, names ...string) (map[string][]string, error) {
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	md, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": cluster})
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id, Metadata: md}, TypeUrl: resourcev3.EndpointType, ResourceNames: names}); err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if resp.GetTypeUrl() != resourcev3.EndpointType {
			continue
		}
		out := map[string][]string{}
		for _, a := range resp.GetResources() {
			var cla endpointv3.ClusterLoadAssignment
			if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
				t.Fatal(err)
			}
			eps := []string{}
			for _, le := range cla.GetEndpoints() {
				for _, lb := range le.GetLbEndpoints() {
					ep := lb.GetEndpoint()
					sa := ep.GetAddress().GetSocketAddress()
					s := net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue())) + " " + lb.GetHealthStatus().String()
					var extra []string
					for _, x := range ep.GetAdditionalAddresses() {
						xa := x.GetAddress().GetSocketAddress()
						extra = append(extra, net.JoinHostPort(xa.GetAddress(), fmt.Sprint(xa.GetPortValue())))
					}
					if len(extra) > 0 {
						s += " +" + strings.Join(extra, ",")
					}
					eps = append(eps, s)
				}
			}
			slices.Sort(eps)
			out[cla.GetClusterName()] = eps
		}
		return out, nil
	}
}

// TestKubernetesMCSOverXDS: the kubernetes plugin with mcs and
// clusterset_only, on two real API servers with the upstream MCS CRDs,
// seen by ADS clients of each cluster. clusterset.local has the endpoints
// of the exporting cluster only, whatever the client's cluster;
// cluster.local has the client's own cluster's. On the way, a dual-stack
// pod arrives as one endpoint with its IPv6 address as an additional
// address, and a terminating pod that still serves arrives DRAINING.
func TestKubernetesMCSOverXDS(t *testing.T) {
	kubes := testbed.StartKubes(t, 2)
	k1, k2 := kubes[0], kubes[1]
	ctx := context.Background()
	ns := fmt.Sprintf("mcs-%d", time.Now().UnixNano()%100000)
	for i, k := range kubes {
		k.InstallMCSCRDs(t)
		c := k.Client()
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 8080}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := func(name string) *corev1.ObjectReference {
			return &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name}
		}
		serving := discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
		draining := discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		for _, s := range []*discoveryv1.EndpointSlice{{
			ObjectMeta:  metav1.ObjectMeta{Name: "echo-v4"},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{fmt.Sprintf("10.%d.0.1", i+1)}, Conditions: serving, TargetRef: pod("a")},
				{Addresses: []string{fmt.Sprintf("10.%d.0.2", i+1)}, Conditions: draining, TargetRef: pod("b")},
			},
		}, {
			ObjectMeta:  metav1.ObjectMeta{Name: "echo-v6"},
			AddressType: discoveryv1.AddressTypeIPv6,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("fd00:%d::1", i+1)}, Conditions: serving, TargetRef: pod("a")}},
		}} {
			s.Namespace, s.Labels = ns, map[string]string{discoveryv1.LabelServiceName: "echo"}
			s.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](18080)}}
			if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// cluster1 exports echo; cluster2 has it too but does not.
	dyn, err := dynamic.NewForConfig(k1.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	export := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": "echo", "namespace": ns},
	}}
	exports := dyn.Resource(schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceexports"}).Namespace(ns)
	if _, err := exports.Create(ctx, export, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	remoteSecretFor(t, k1, k2)
	h := startHost(t, fmt.Sprintf(`plugin "kubernetes" {
  config {
    kubeconfig      = %q
    cluster_id      = "cluster1"
    mcs             = true
    clusterset_only = true
  }
}
`, k1.Kubeconfig))

	local, set := model.ClusterName(8080, "", "echo."+ns+".svc.cluster.local"), model.ClusterName(8080, "", "echo."+ns+".svc.clusterset.local")
	want := func(n int) []string {
		return []string{
			fmt.Sprintf("10.%d.0.1:18080 HEALTHY +[fd00:%d::1]:18080", n, n),
			fmt.Sprintf("10.%d.0.2:18080 DRAINING", n),
		}
	}
	for _, tc := range []struct {
		cluster         string
		local, clusters []string
	}{
		{"cluster1", want(1), want(1)},
		{"cluster2", want(2), want(1)},
	} {
		id := "sidecar~10.9.0.1~client." + ns + "~" + ns + ".svc.cluster.local"
		var got map[string][]string
		h.eventually("EDS of a "+tc.cluster+" client", 60*time.Second, func() bool {
			var err error
			got, err = edsOnce(t, h.xds, id, tc.cluster, local, set)
			return err == nil && slices.Equal(got[local], tc.local) && slices.Equal(got[set], tc.clusters)
		})
		if !slices.Equal(got[local], tc.local) || !slices.Equal(got[set], tc.clusters) {
			t.Errorf("%s client: cluster.local %v (want %v), clusterset.local %v (want %v)", tc.cluster, got[local], tc.local, got[set], tc.clusters)
		}
	}

	// `estuary proxy-config` shows the additional address of a connected
	// node's endpoint.
	id := "sidecar~10.9.0.2~held." + ns + "~" + ns + ".svc.cluster.local"
	adsEndpoints(t, h.xds, id, map[string]any{"CLUSTER_ID": "cluster1"})
	var rows []struct {
		Endpoint string   `json:"endpoint"`
		Also     []string `json:"additional_addresses"`
	}
	h.getJSON("/debug/proxyendpointz?node="+id+"&cluster="+set, &rows)
	also := map[string][]string{}
	for _, r := range rows {
		also[r.Endpoint] = r.Also
	}
	if len(also) != 2 || !slices.Equal(also["10.1.0.1:18080"], []string{"[fd00:1::1]:18080"}) || also["10.1.0.2:18080"] != nil {
		t.Errorf("proxy-config rows of %s: %+v, want 10.1.0.1:18080 with [fd00:1::1]:18080 and 10.1.0.2:18080 alone", set, rows)
	}
}
