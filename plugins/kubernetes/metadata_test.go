package kubernetes

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestRemoteSecretsCannotAimAtMetadataOrTheHost: with no allowed_servers
// at all, a remote secret whose server is the cloud metadata address, or
// whose proxy is, or whose server is the host's own admin listener, is
// refused, and the primary cluster's health says so for each; none
// becomes an instance. The password in a server URL is never shown.
func TestRemoteSecretsCannotAimAtMetadataOrTheHost(t *testing.T) {
	k := testbed.StartKube(t)
	kc := kube{t, k.Client()}
	kc.namespaceNamed("istio-system", nil)
	const adminAddr = "127.0.0.1:15999" // the host's, as MeshSettings says
	rec := startRecorder(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"cluster1\"\n", k.Kubeconfig),
		sdk.MeshSettings{DomainSuffix: "cluster.local", HostAddresses: []string{"127.0.0.1:15998", adminAddr}})
	rec.waitFor(t, "cluster1 synced", func(r *sdktest.Replica) bool { in := instance(r, "cluster1"); return in != nil && in.Synced })

	metadata := remoteKubeconfig("cluster2", "https://admin:s3cr3t-pw@169.254.169.254", k.CAData, "s3cr3t-token")
	proxied := strings.Replace(remoteKubeconfig("cluster3", k.Server, k.CAData, "s3cr3t-token"),
		"    server: ", "    proxy-url: http://169.254.169.254:80\n    server: ", 1)
	self := remoteKubeconfig("cluster4", "https://"+adminAddr, k.CAData, "s3cr3t-token")
	secrets := k.Client().CoreV1().Secrets("istio-system")
	if _, err := secrets.Create(t.Context(), remoteSecret("istio-system", "aimed", map[string]string{
		"cluster2": metadata, "cluster3": proxied, "cluster4": self,
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []struct{ subject, message string }{
		{`secret istio-system/aimed, key "cluster2"`, `server https://169.254.169.254 is refused: 169.254.169.254 is a link-local, metadata or unspecified address`},
		{`secret istio-system/aimed, key "cluster3"`, `proxy-url http://169.254.169.254:80 is refused`},
		{`secret istio-system/aimed, key "cluster4"`, `server https://` + adminAddr + ` is refused: ` + adminAddr + ` is where estuary itself listens`},
	}
	rec.waitFor(t, "a notice for each refused kubeconfig", func(r *sdktest.Replica) bool {
		in := instance(r, "cluster1")
		for _, w := range want {
			if !hasNotice(in, w.subject, w.message) {
				return false
			}
		}
		return true
	})
	rec.with(func(r *sdktest.Replica) {
		for _, c := range []string{"cluster2", "cluster3", "cluster4"} {
			if instance(r, c) != nil {
				t.Errorf("refused secret's cluster %s has an instance", c)
			}
		}
		for _, n := range instance(r, "cluster1").Health.Notices {
			if strings.Contains(n.Message, "s3cr3t") {
				t.Errorf("notice shows a credential: %+v", n)
			}
		}
	})
}
