// Command dra-v1beta1-driver is upstream's DRA test driver (test/e2e/dra/test-driver) as a
// kubelet plugin that serves only the v1beta1 DRAPlugin API, as drivers built against
// Kubernetes 1.33 and older do: the node agent must call that API version to prepare its
// claims. It publishes one ResourceSlice of two devices for its node and streams their health
// (DRAResourceHealth): unknown until SIGUSR1 makes both unhealthy. It runs until SIGTERM, when
// it removes its sockets.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dra-v1beta1-driver:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig to reach the API server with")
	driver := flag.String("driver-name", "v1beta1.test-driver.cdi.k8s.io", "the driver's name")
	node := flag.String("node-name", "", "the node the plugin serves")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI specs of prepared claims go")
	registry := flag.String("plugin-registration-path", kubeletplugin.KubeletRegistryDir, "the node agent's plugin registry")
	dataDir := flag.String("datadir", kubeletplugin.KubeletPluginsDir, "the directory of the driver's own socket directory")
	flag.Parse()
	if *node == "" {
		return fmt.Errorf("--node-name not set")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("read %s: %w", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	socketDir := filepath.Join(*dataDir, *driver)
	for _, dir := range []string{*cdiDir, socketDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	devices := []string{"device-00", "device-01"}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{
			{Name: devices[0]}, {Name: devices[1]},
		}}}},
	}}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	plugin, err := app.StartPlugin(ctx, *cdiDir, *driver, client, *node,
		app.FileOperations{DriverResources: &resources},
		kubeletplugin.PluginDataDirectoryPath(socketDir),
		kubeletplugin.RegistrarDirectoryPath(*registry),
		kubeletplugin.NodeV1(false),
		kubeletplugin.NodeV1beta1(true),
	)
	if err != nil {
		return fmt.Errorf("start the plugin: %w", err)
	}
	unhealthy := make(chan os.Signal, 1)
	signal.Notify(unhealthy, syscall.SIGUSR1)
	for {
		select {
		case <-ctx.Done():
			plugin.Stop()
			return nil
		case <-unhealthy:
			for _, device := range devices {
				plugin.HealthControlChan <- app.DeviceHealthUpdate{
					PoolName: *node, DeviceName: device, Health: "Unhealthy", Message: "marked unhealthy by the test",
				}
			}
		}
	}
}
