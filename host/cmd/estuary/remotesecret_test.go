package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed"
)

// unfilledAccount is a service account the stand-in token controller
// leaves alone, to show the command's deadline.
const unfilledAccount = "nobody-fills-this"

// standInTokenController does, in a testbed cluster, what
// kube-controller-manager's token controller does in a real one (the
// testbed runs no controller-manager): it fills every empty
// kubernetes.io/service-account-token Secret with a token of its service
// account, the CA and the namespace, and the account's UID annotation.
// The real controller signs a legacy token with its own key; this one
// asks the API server for a token bound to the Secret (TokenRequest), so
// it too is valid exactly while the Secret exists. It runs until the test
// ends.
func standInTokenController(t *testing.T, k *testbed.Kube) {
	t.Helper()
	c := k.Client()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ctx.Err() == nil {
			list, err := c.CoreV1().Secrets("").List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("type", string(corev1.SecretTypeServiceAccountToken)).String()})
			if err == nil {
				for i := range list.Items {
					if err := fillToken(ctx, c, &list.Items[i], k.CAData); err != nil && ctx.Err() == nil {
						t.Errorf("stand-in token controller: %v", err)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

func fillToken(ctx context.Context, c kubernetes.Interface, s *corev1.Secret, ca []byte) error {
	name := s.Annotations[corev1.ServiceAccountNameKey]
	if len(s.Data[corev1.ServiceAccountTokenKey]) > 0 || name == unfilledAccount {
		return nil
	}
	sa, err := c.CoreV1().ServiceAccounts(s.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil // the real controller waits for the account too
	}
	day := int64(24 * 3600)
	tr, err := c.CoreV1().ServiceAccounts(s.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &day,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", s.Namespace, name, err)
	}
	s.Annotations[corev1.ServiceAccountUIDKey] = string(sa.UID)
	s.Data = map[string][]byte{
		corev1.ServiceAccountTokenKey:     []byte(tr.Status.Token),
		corev1.ServiceAccountRootCAKey:    ca,
		corev1.ServiceAccountNamespaceKey: []byte(s.Namespace),
	}
	_, err = c.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// createRemoteSecretCmd runs `estuary create-remote-secret args...` and
// returns its stdout, its stderr and its exit code.
func createRemoteSecretCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(estuaryBin, append([]string{"create-remote-secret"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// testbedContext is the context of a testbed kubeconfig whose user has a
// client certificate (the current one has a token).
func testbedContext(k *testbed.Kube) string {
	return "testbed-" + k.Server[strings.LastIndex(k.Server, ":")+1:] + "-cert"
}

// TestCreateRemoteSecret: the remote secret printed for cluster 2 and
// applied in cluster 1 makes the real estuary host on cluster 1 serve
// cluster 2's endpoints, read with the service account and read-only role
// the command made. Run again, the command changes nothing and prints the
// same secret. A wrong --context, a server the plugin refuses and a token
// nobody fills each fail with an error saying so.
func TestCreateRemoteSecret(t *testing.T) {
	kubes := testbed.StartKubes(t, 2)
	k1, k2 := kubes[0], kubes[1]
	standInTokenController(t, k2)
	ctx := context.Background()
	ns := "rs-" + strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	kubeEcho(t, k2.Client(), ns, "10.96.2.2", "10.2.0.1")

	args := []string{"--kubeconfig", k2.Kubeconfig, "--context", testbedContext(k2), "--name", "cluster2"}
	out, stderr, code := createRemoteSecretCmd(t, args...)
	if code != 0 {
		t.Fatalf("create-remote-secret exited %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("create-remote-secret wrote to stderr: %s", stderr)
	}
	var secret corev1.Secret
	if err := yaml.Unmarshal([]byte(out), &secret); err != nil {
		t.Fatalf("output is not a Secret: %v\n%s", err, out)
	}
	if secret.Kind != "Secret" || secret.Namespace != "istio-system" || secret.Labels["istio/multiCluster"] != "true" ||
		secret.Annotations["networking.istio.io/cluster"] != "cluster2" || len(secret.StringData) != 1 {
		t.Fatalf("secret %s/%s (kind %q) labels %v annotations %v keys %d: not a remote secret of cluster2",
			secret.Namespace, secret.Name, secret.Kind, secret.Labels, secret.Annotations, len(secret.StringData))
	}
	kc, err := clientcmd.Load([]byte(secret.StringData["cluster2"]))
	if err != nil {
		t.Fatalf("data key cluster2 is not a kubeconfig: %v", err)
	}
	cl, user := kc.Clusters["cluster2"], kc.AuthInfos["cluster2"]
	if cl == nil || user == nil || kc.CurrentContext != "cluster2" || cl.Server != k2.Server ||
		!bytes.Equal(cl.CertificateAuthorityData, k2.CAData) || user.Token == "" || user.Token == k2.Token ||
		user.Exec != nil || user.ClientCertificateData != nil {
		t.Fatalf("kubeconfig: want cluster and user cluster2, server %s, the inline CA and a token of its own", k2.Server)
	}

	// Only what the plugin reads, and no write: the account may list
	// pods cluster-wide but not Secrets, and may not create anything.
	for _, tc := range []struct {
		verb, group, resource string
		want                  bool
	}{
		{"watch", "discovery.k8s.io", "endpointslices", true},
		{"list", "", "pods", true},
		{"list", "", "nodes", true},
		{"watch", "multicluster.x-k8s.io", "serviceexports", true},
		{"create", "multicluster.x-k8s.io", "serviceexports", false},
		{"list", "", "secrets", false},
		{"create", "", "services", false},
		{"delete", "", "pods", false},
	} {
		sar, err := k2.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:istio-system:istio-reader-service-account",
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tc.verb, Group: tc.group, Resource: tc.resource},
			}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.want {
			t.Errorf("the remote account may %s %s: %v, want %v", tc.verb, tc.resource, sar.Status.Allowed, tc.want)
		}
	}

	// Apply it in cluster 1, where the plugin watches istio-system.
	if _, err := k1.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k1.Client().CoreV1().Secrets("istio-system").Create(ctx, &secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, fmt.Sprintf("plugin \"kubernetes\" {\n  config {\n    kubeconfig = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", k1.Kubeconfig))
	host := "echo." + ns + ".svc.cluster.local"
	eventuallyEndpoints(t, h, "sidecar~10.1.0.9~client.default~default.svc.cluster.local",
		map[string]any{"CLUSTER_ID": "cluster1"}, host, 1, []string{"10.2.0.1:8080 w=1"})

	// Twice: the same secret, and still one of each object.
	again, stderr, code := createRemoteSecretCmd(t, args...)
	if code != 0 || again != out {
		t.Errorf("second run: exit %d, same output %v: %s", code, again == out, stderr)
	}
	managed := metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=estuary-create-remote-secret"}
	sas, _ := k2.Client().CoreV1().ServiceAccounts("istio-system").List(ctx, managed)
	roles, _ := k2.Client().RbacV1().ClusterRoles().List(ctx, managed)
	bindings, _ := k2.Client().RbacV1().ClusterRoleBindings().List(ctx, managed)
	secrets, _ := k2.Client().CoreV1().Secrets("istio-system").List(ctx, managed)
	if len(sas.Items) != 1 || len(roles.Items) != 1 || len(bindings.Items) != 1 || len(secrets.Items) != 1 {
		t.Errorf("after two runs: %d service accounts, %d cluster roles, %d bindings, %d token secrets; want one each",
			len(sas.Items), len(roles.Items), len(bindings.Items), len(secrets.Items))
	}
	if got := adsEndpoints(t, h.xds, "sidecar~10.1.0.8~other.default~default.svc.cluster.local", map[string]any{"CLUSTER_ID": "cluster1"})[model.ClusterName(8080, "", host)]; len(got) != 1 {
		t.Errorf("after the second run a client gets %v", got)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad context", []string{"--kubeconfig", k2.Kubeconfig, "--context", "nope", "--name", "cluster2"},
			`--context "nope" is not in the kubeconfig (contexts: ` + strings.TrimSuffix(testbedContext(k2), "-cert")},
		{"metadata server", []string{"--kubeconfig", k2.Kubeconfig, "--name", "cluster2", "--server", "https://169.254.169.254", "--service-account", "never-made"},
			"the kubernetes plugin would refuse server https://169.254.169.254"},
		{"no token", []string{"--kubeconfig", k2.Kubeconfig, "--name", "cluster2", "--service-account", unfilledAccount, "--timeout", "2s"},
			"waited 2s for the token controller to fill secret istio-system/" + unfilledAccount + "-estuary-token: it is still empty"},
		{"no name", []string{"--kubeconfig", k2.Kubeconfig}, "--name is required"},
		{"bad name", []string{"--kubeconfig", k2.Kubeconfig, "--name", "cluster/2"}, `--name "cluster/2" cannot be a secret data key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, code := createRemoteSecretCmd(t, tc.args...)
			if code == 0 || out != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want a failure saying %q", code, out, stderr, tc.want)
			}
		})
	}
	// A refused server is refused before anything is made.
	if _, err := k2.Client().CoreV1().ServiceAccounts("istio-system").Get(ctx, "never-made", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("service account never-made: %v, want it not made for a refused server", err)
	}
}
