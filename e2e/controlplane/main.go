// Command controlplane runs one component of a Kubernetes v1.37 test control plane: an embedded
// etcd, kube-apiserver, kube-controller-manager or kube-scheduler, built from the released
// modules. The test tier (tests/e2e) starts each component as its own process of this binary.
//
//	controlplane etcd DATA_DIR CLIENT_URL PEER_URL
//	controlplane certs DIR                   (CA, API server serving pair, service-account key)
//	controlplane kube-apiserver FLAGS...     (GPUSLICE_SERVICE_MAP: ns/name=host:port,...)
//	controlplane kube-controller-manager FLAGS...
//	controlplane kube-scheduler FLAGS...
package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: controlplane etcd|certs|kube-apiserver|kube-controller-manager|kube-scheduler ARGS...")
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "etcd":
		if len(args) != 3 {
			fail("usage: controlplane etcd DATA_DIR CLIENT_URL PEER_URL")
		}
		runEtcd(args[0], args[1], args[2])
	case "certs":
		if len(args) != 1 {
			fail("usage: controlplane certs DIR")
		}
		if err := writeCerts(args[0]); err != nil {
			fail("certs: " + err.Error())
		}
	case "kube-apiserver":
		resolver, err := parseServiceMap(os.Getenv("GPUSLICE_SERVICE_MAP"))
		if err != nil {
			fail("GPUSLICE_SERVICE_MAP: " + err.Error())
		}
		apiserver.SetServiceResolverForTests(resolver)
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-scheduler":
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	default:
		fail(fmt.Sprintf("unknown component %q: expected etcd, certs, kube-apiserver, kube-controller-manager or kube-scheduler", component))
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "controlplane: "+message)
	os.Exit(2)
}

func runEtcd(dataDir, clientURL, peerURL string) {
	config := embed.NewConfig()
	config.Dir = dataDir
	config.Name = "controlplane"
	config.LogLevel = "error"
	urls, err := parseURLs(clientURL, peerURL)
	if err != nil {
		fail("etcd: " + err.Error())
	}
	config.ListenClientUrls = []url.URL{urls[0]}
	config.AdvertiseClientUrls = []url.URL{urls[0]}
	config.ListenPeerUrls = []url.URL{urls[1]}
	config.AdvertisePeerUrls = []url.URL{urls[1]}
	config.InitialCluster = config.InitialClusterFromName(config.Name)
	server, err := embed.StartEtcd(config)
	if err != nil {
		fail("etcd: " + err.Error())
	}
	<-server.Server.ReadyNotify()
	fmt.Println("etcd ready on " + clientURL)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-signals:
	case err := <-server.Err():
		fail("etcd: " + err.Error())
	}
	server.Close()
}
