package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	applyrbacv1 "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	kubeplugin "github.com/estuary-mesh/estuary/plugins/kubernetes"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// The defaults are istioctl's, so a remote cluster prepared for Istio is
// read with the same account.
const (
	defaultRemoteNamespace      = "istio-system"
	defaultRemoteServiceAccount = "istio-reader-service-account"
	// remoteReaderRole is the ClusterRole the remote service account is
	// bound to: exactly what the kubernetes plugin watches in a member
	// cluster, and no write verb.
	remoteReaderRole = "estuary-remote-reader"
	// fieldManager owns the objects create-remote-secret applies, so a
	// second run updates them instead of failing or duplicating them.
	fieldManager = "estuary-create-remote-secret"
)

// remoteReaderRules is what the kubernetes plugin's informers read in a
// member cluster (plugins/kubernetes cluster.go): Services,
// EndpointSlices, Pods, Nodes and Namespaces, cluster-wide, and with
// `mcs = true` ServiceExports and ServiceImports (as Istio's reader role
// grants them). Secrets are read only in the primary, so they are not
// here.
func remoteReaderRules() []*applyrbacv1.PolicyRuleApplyConfiguration {
	verbs := []string{"get", "list", "watch"}
	return []*applyrbacv1.PolicyRuleApplyConfiguration{
		applyrbacv1.PolicyRule().WithAPIGroups("").WithResources("services", "pods", "nodes", "namespaces").WithVerbs(verbs...),
		applyrbacv1.PolicyRule().WithAPIGroups("discovery.k8s.io").WithResources("endpointslices").WithVerbs(verbs...),
		applyrbacv1.PolicyRule().WithAPIGroups("multicluster.x-k8s.io").WithResources("serviceexports", "serviceimports").WithVerbs(verbs...),
	}
}

// remoteSecretOptions are the flags of create-remote-secret.
type remoteSecretOptions struct {
	kubeconfig, context string
	clusterID           string
	namespace           string
	server              string
	serviceAccount      string
	timeout             time.Duration
}

// createRemoteSecret prepares a member cluster for the kubernetes plugin
// and prints the remote secret to apply in the primary, like
// `istioctl create-remote-secret`.
func createRemoteSecret(args []string) int {
	fs := flag.NewFlagSet("create-remote-secret", flag.ContinueOnError)
	o := remoteSecretOptions{}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the remote cluster (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context of the remote cluster (default: the current context)")
	fs.StringVar(&o.clusterID, "name", "", "cluster ID of the remote cluster: the secret's data key (required)")
	fs.StringVar(&o.namespace, "namespace", defaultRemoteNamespace, "namespace of the service account in the remote cluster, and of the printed secret (the plugin's secret_namespace)")
	fs.StringVar(&o.server, "server", "", "API server URL to write into the kubeconfig (default: the one the kubeconfig names)")
	fs.StringVar(&o.serviceAccount, "service-account", defaultRemoteServiceAccount, "service account the control plane reads the remote cluster as")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "how long to wait for the token controller to fill the token")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "create-remote-secret: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "create-remote-secret:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out, err := o.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "create-remote-secret:", err)
		return 1
	}
	os.Stdout.Write(out)
	return 0
}

// validate checks the flags before anything is contacted.
func (o *remoteSecretOptions) validate() error {
	var errs []error
	if o.clusterID == "" {
		errs = append(errs, errors.New("--name is required: the remote cluster's ID"))
	} else if msgs := validation.IsConfigMapKey(o.clusterID); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--name %q cannot be a secret data key: %s", o.clusterID, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(o.namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--namespace %q: %s", o.namespace, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Subdomain(o.serviceAccount); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--service-account %q: %s", o.serviceAccount, strings.Join(msgs, "; ")))
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s must be positive", o.timeout))
	}
	return errors.Join(errs...)
}

// restConfig loads the remote cluster's client config as kubectl does.
// A --context the kubeconfig lacks is named with the ones it has.
func (o *remoteSecretOptions) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	if o.context != "" {
		raw, err := cc.RawConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the kubeconfig: %w", err)
		}
		if _, ok := raw.Contexts[o.context]; !ok {
			names := slices.Sorted(maps.Keys(raw.Contexts))
			return nil, fmt.Errorf("--context %q is not in the kubeconfig (contexts: %s)", o.context, strings.Join(names, ", "))
		}
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	// A handful of requests: client-side throttling would only turn the
	// token wait's last poll into a rate limiter error instead of the
	// Secret's state (the API server's own flow control still applies).
	rc.QPS = -1
	return rc, nil
}

// tokenSecretName is the long-lived token Secret of the service account.
func (o *remoteSecretOptions) tokenSecretName() string {
	return o.serviceAccount + "-estuary-token"
}

// run applies the service account, its read-only role and its token
// Secret in the remote cluster, waits for the token and returns the
// remote secret's YAML.
func (o *remoteSecretOptions) run(ctx context.Context) ([]byte, error) {
	rc, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", redact.URL(rc.Host), err)
	}
	// Refuse a server the plugin would refuse before changing anything.
	server := cmp.Or(o.server, rc.Host)
	if err := checkRemoteServer(server); err != nil {
		return nil, err
	}
	if err := o.apply(ctx, client); err != nil {
		return nil, fmt.Errorf("preparing cluster %q at %s: %w", o.clusterID, redact.URL(rc.Host), err)
	}
	token, caData, err := o.waitForToken(ctx, client)
	if err != nil {
		return nil, err
	}
	if len(caData) == 0 {
		// The token controller copies its root CA (kube-controller-manager's
		// --root-ca-file); without one, trust what the operator's kubeconfig trusts.
		if err := rest.LoadTLSFiles(rc); err != nil {
			return nil, fmt.Errorf("reading the kubeconfig's CA: %w", err)
		}
		caData = rc.CAData
	}
	if len(caData) == 0 {
		return nil, fmt.Errorf("secret %s/%s has no ca.crt and the kubeconfig names no CA: the remote secret needs the API server's CA", o.namespace, o.tokenSecretName())
	}
	kubeconfig, err := remoteKubeconfig(o.clusterID, server, caData, token)
	if err != nil {
		return nil, err
	}
	if err := kubeplugin.CheckRemoteKubeconfig(kubeconfig); err != nil {
		return nil, fmt.Errorf("the kubernetes plugin would refuse this kubeconfig: %w", err)
	}
	secret := applycorev1.Secret(remoteSecretName(o.clusterID), o.namespace).
		WithLabels(map[string]string{istio.LabelMultiCluster: "true"}).
		WithAnnotations(map[string]string{istio.AnnotationCluster: o.clusterID}).
		WithType(corev1.SecretTypeOpaque).
		WithStringData(map[string]string{o.clusterID: string(kubeconfig)})
	out, err := yaml.Marshal(secret)
	if err != nil {
		return nil, fmt.Errorf("encoding the remote secret: %w", err)
	}
	return append([]byte("# Remote secret of cluster "+o.clusterID+": apply it in every primary cluster.\n---\n"), out...), nil
}

// remoteSecretName is istioctl's name for the remote secret of a
// cluster, made a valid object name (a cluster ID may hold '_' and capitals).
func remoteSecretName(clusterID string) string {
	return "istio-remote-secret-" + strings.ToLower(strings.ReplaceAll(clusterID, "_", "-"))
}

// apply creates or updates, by server-side apply, what the control plane
// needs in the remote cluster. The namespace is created when missing
// (istioctl expects it to exist); it is never changed when present.
func (o *remoteSecretOptions) apply(ctx context.Context, c kubernetes.Interface) error {
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if _, err := c.CoreV1().Namespaces().Get(ctx, o.namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.namespace}}, metav1.CreateOptions{FieldManager: fieldManager})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s: %w", o.namespace, err)
		}
	} else if err != nil {
		return fmt.Errorf("namespace %s: %w", o.namespace, err)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": fieldManager}
	if _, err := c.CoreV1().ServiceAccounts(o.namespace).Apply(ctx,
		applycorev1.ServiceAccount(o.serviceAccount, o.namespace).WithLabels(labels), opts); err != nil {
		return fmt.Errorf("service account %s/%s: %w", o.namespace, o.serviceAccount, err)
	}
	if _, err := c.RbacV1().ClusterRoles().Apply(ctx,
		applyrbacv1.ClusterRole(remoteReaderRole).WithLabels(labels).WithRules(remoteReaderRules()...), opts); err != nil {
		return fmt.Errorf("cluster role %s: %w", remoteReaderRole, err)
	}
	binding := remoteReaderRole + "-" + o.namespace + "-" + o.serviceAccount
	if _, err := c.RbacV1().ClusterRoleBindings().Apply(ctx,
		applyrbacv1.ClusterRoleBinding(binding).WithLabels(labels).
			WithRoleRef(applyrbacv1.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(remoteReaderRole)).
			WithSubjects(applyrbacv1.Subject().WithKind("ServiceAccount").WithNamespace(o.namespace).WithName(o.serviceAccount)), opts); err != nil {
		return fmt.Errorf("cluster role binding %s: %w", binding, err)
	}
	// A long-lived token (Kubernetes 1.24+ no longer makes one per service
	// account): the token controller fills this Secret and keeps it valid
	// for as long as the Secret and the account exist.
	if _, err := c.CoreV1().Secrets(o.namespace).Apply(ctx,
		applycorev1.Secret(o.tokenSecretName(), o.namespace).WithLabels(labels).
			WithAnnotations(map[string]string{corev1.ServiceAccountNameKey: o.serviceAccount}).
			WithType(corev1.SecretTypeServiceAccountToken), opts); err != nil {
		return fmt.Errorf("token secret %s/%s: %w", o.namespace, o.tokenSecretName(), err)
	}
	return nil
}

// waitForToken waits until the token controller has filled the token
// Secret, and returns the token and the CA it wrote.
func (o *remoteSecretOptions) waitForToken(ctx context.Context, c kubernetes.Interface) (token, caData []byte, err error) {
	name := o.tokenSecretName()
	var last error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
		s, err := c.CoreV1().Secrets(o.namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			// A Get cut short by the deadline says nothing about the
			// Secret; the error that explains the wait is an earlier one.
			if ctx.Err() == nil {
				last = err
			}
			return false, nil
		}
		last = nil // read, but empty
		token, caData = s.Data[corev1.ServiceAccountTokenKey], s.Data[corev1.ServiceAccountRootCAKey]
		return len(token) > 0, nil
	})
	if err != nil {
		why := "it is still empty: is kube-controller-manager running, with --service-account-private-key-file?"
		if last != nil {
			why = last.Error()
		}
		return nil, nil, fmt.Errorf("waited %s for the token controller to fill secret %s/%s: %s", o.timeout, o.namespace, name, why)
	}
	return token, caData, nil
}

// checkRemoteServer runs the plugin's kubeconfig checks on a kubeconfig
// naming server, so that a server the plugin refuses (a metadata address,
// a URL without a host) stops the command before it changes the cluster.
func checkRemoteServer(server string) error {
	probe, err := remoteKubeconfig("probe", server, nil, []byte("probe"))
	if err != nil {
		return err
	}
	if err := kubeplugin.CheckRemoteKubeconfig(probe); err != nil {
		return fmt.Errorf("the kubernetes plugin would refuse server %s: %w", redact.URL(server), err)
	}
	return nil
}

// remoteKubeconfig is the kubeconfig of a remote secret: one cluster,
// user and context, all named after the cluster ID, with the CA and the
// token inline, as the kubernetes plugin accepts it without any
// allow_kubeconfig_options.
func remoteKubeconfig(clusterID, server string, caData, token []byte) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[clusterID] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	cfg.AuthInfos[clusterID] = &clientcmdapi.AuthInfo{Token: string(token)}
	cfg.Contexts[clusterID] = &clientcmdapi.Context{Cluster: clusterID, AuthInfo: clusterID}
	cfg.CurrentContext = clusterID
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	return out, nil
}
