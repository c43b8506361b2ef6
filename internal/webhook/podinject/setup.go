package podinject

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// nativeSidecarsSince is the first Kubernetes version with native sidecars on by default.
var nativeSidecarsSince = version.MajorMinor(1, 29)

// Server is the webhook server. In self-signed mode it starts only once the rotator has its
// certificate mounted and its CA in the caBundle: before that it could not load the
// certificate, and the readiness check, which needs a started server, keeps the replica out of
// the Service.
type Server struct {
	webhook.Server
	certReady chan struct{} // nil in cert-manager mode
}

// NewServer returns the webhook server for cfg, for ctrl.Options.WebhookServer. With
// cfg.ClientCAFile it answers only clients with a certificate that CA signed; an unreadable
// file fails every handshake (cfg.Validate reports it first).
func NewServer(cfg Config) *Server {
	opts := webhook.Options{Port: cfg.Port, CertDir: cfg.CertDir}
	if cfg.ClientCAFile != "" {
		v := &clientVerifier{file: cfg.ClientCAFile, names: cfg.ClientNames}
		opts.TLSOpts = append(opts.TLSOpts, v.apply)
	}
	s := &Server{Server: webhook.NewServer(opts)}
	if cfg.CertMode == CertModeSelfSigned {
		s.certReady = make(chan struct{})
	}
	return s
}

// Start serves once the certificate is ready, until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	if s.certReady != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-s.certReady:
		}
	}
	return s.Server.Start(ctx)
}

// Setup registers the pod injection webhook with mgr. In self-signed mode it also makes sure
// the certificate Secret exists and adds the rotator that fills it and patches the caBundle;
// the manager's webhook server must then come from NewServer with the same cfg.
func Setup(mgr ctrl.Manager, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("checking webhook configuration: %w", err)
	}
	log := mgr.GetLogger().WithName("podinject")

	native, err := resolveNative(cfg.NativeSidecars, mgr.GetConfig(), log)
	if err != nil {
		return err
	}

	srv := mgr.GetWebhookServer()
	if cfg.CertMode == CertModeSelfSigned {
		gated, ok := srv.(*Server)
		if !ok || gated.certReady == nil {
			return errors.New("self-signed certificates need the manager's webhook server from podinject.NewServer with the same configuration")
		}
		// The manager's client would read Secrets from a cache that has not started yet.
		direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
		if err != nil {
			return fmt.Errorf("creating client for the webhook certificate: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := createCertSecret(ctx, direct, cfg); err != nil {
			return err
		}
		if err := rotator.AddRotator(mgr, NewCertRotator(cfg, gated.certReady)); err != nil {
			return fmt.Errorf("adding the webhook certificate rotator: %w", err)
		}
	}

	in := NewInjector(cfg, native)
	if cfg.Budget != nil || cfg.Backends != nil {
		in.sizer = &poolSizer{
			cache: mgr.GetClient(), direct: mgr.GetAPIReader(),
			timeout: cfg.BudgetLookupTimeout, log: log.WithName("budget"), verifiedClients: cfg.ClientCAFile != "",
		}
	}
	if cfg.Backends != nil {
		r := &NamespaceRedisReconciler{Client: mgr.GetClient(), Config: &cfg}
		if err := r.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("adding the sidecar redis settings reconciler: %w", err)
		}
	}
	srv.Register(Path, &webhook.Admission{Handler: NewHandler(in, mgr.GetScheme(), log)})
	srv.Register(NamespacePath, &webhook.Admission{Handler: NewNamespaceHandler(in, mgr.GetScheme(), log)})
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return fmt.Errorf("adding the webhook readiness check: %w", err)
	}
	log.Info("pod injection webhook registered", "paths", []string{Path, NamespacePath}, "nativeSidecars", native,
		"certMode", cfg.CertMode, "clientCertificates", cfg.ClientCAFile != "", "sidecarImage", cfg.SidecarImage, "poolsFromBudget", cfg.Backends != nil)
	return nil
}

// resolveNative turns the --native-sidecars setting into a decision, asking the API server
// its version in auto mode. When it cannot tell, it injects a regular container: that works on
// every version, where an init container with restartPolicy is refused before 1.29.
func resolveNative(setting string, cfg *rest.Config, log logr.Logger) (bool, error) {
	switch setting {
	case NativeSidecarsTrue:
		return true, nil
	case NativeSidecarsFalse:
		return false, nil
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, fmt.Errorf("creating discovery client: %w", err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		log.Error(err, "reading the API server version; injecting regular sidecar containers")
		return false, nil
	}
	v, err := serverVersion(info.GitVersion, info.Major, info.Minor)
	if err != nil {
		log.Error(err, "parsing the API server version; injecting regular sidecar containers")
		return false, nil
	}
	return v.AtLeast(nativeSidecarsSince), nil
}

// serverVersion parses gitVersion ("v1.30.2-eks-1234"), or else major and minor ("1", "29+").
func serverVersion(gitVersion, major, minor string) (*version.Version, error) {
	if v, err := version.ParseGeneric(gitVersion); err == nil {
		return v, nil
	}
	v, err := version.ParseGeneric(strings.TrimSuffix(major, "+") + "." + strings.TrimSuffix(minor, "+"))
	if err != nil {
		return nil, fmt.Errorf("parsing server version %q (%s.%s): %w", gitVersion, major, minor, err)
	}
	return v, nil
}
