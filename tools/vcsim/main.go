// Command vcsim-launcher serves govmomi's vCenter simulator on loopback for the tests.
//
// Debian packages govmomi's simulator library (0.24) but no vcsim command, so this is the
// smallest launcher: build a VPX inventory of the requested size, serve it over HTTPS on
// 127.0.0.1, print the SDK URL (with credentials) on stdout and block until SIGTERM or SIGINT.
//
// It also corrects defects of that simulator version at the SOAP boundary, so that tests see
// what vCenter does: CloneVM_Task hands the source VM's own device objects to the clone (after
// which the source reports the clone's disk paths and sizes), ignores a linked clone's
// snapshot (its disks get no parent), ignores the clone spec's CPU, memory, firmware, hot-add,
// nesting and customization, and accepts a name already taken in the target folder (vCenter
// fails the clone task with DuplicateName); RevertToSnapshot_Task leaves CPU and memory as they are
// instead of restoring the snapshot's; and a NIC removed by ReconfigVM_Task stays in guest.net
// (so CustomizeVM_Task counts NICs the VM no longer has).
//
// For disk imports: the NFC handler answers 200 to an upload of an import lease's disk and
// throws the bytes away, where vCenter writes them into the disk (the launcher stores them in
// the disk file as sent: vCenter would convert a streamOptimized upload to its own format);
// CreateVM_Task accepts a name already taken in the folder (vCenter fails with DuplicateName);
// and Destroy_Task deletes only the VM's home directory, where vCenter deletes every disk
// attached to the VM wherever it lives.
//
// For disk exports: the simulator has no ExportVm and no ExportSnapshot. The launcher answers
// them as vCenter does: InvalidPowerState for ExportVm of a VM that is not powered off, else a
// ready HttpNfcLease (with an export task that succeeds on HttpNfcLeaseComplete and fails on
// HttpNfcLeaseAbort) whose device URLs serve each disk as a streamOptimized vmdk: the bytes an
// import lease stored in the disk file as they are, or, for a disk the simulator left blank, a
// vmdk of the disk's capacity holding no grains.
//
// For update sets: the simulator's WaitForUpdatesEx ignores maxObjectUpdates (a view's first
// update set comes in one answer, however large) and collects each filter's whole spec again
// for every object update it dispatches (seconds per change over a view of 10,000 VMs). The
// launcher's property collector (type collector) pages update sets as vCenter does and sends a
// change to an object as the filter's properties that change touched, read from that object.
//
// Every simulated task completes before its call returns, so with -held-task the launcher also
// makes one task that stays running forever and prints its MoRef on a second line: the only
// way to see an unfinished task through the API.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/xml"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"path"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// clones serializes CloneVM_Task and CreateVM_Task calls, so that a name is checked and taken
// in one step, and ImportVApp calls, so that the VM an import made is told apart.
var clones sync.Mutex

// uploads maps an import lease (its MoRef value) to the datastore file of each device URL
// name, from ImportVApp until HttpNfcLeaseComplete or HttpNfcLeaseAbort.
var uploads sync.Map

// exports maps an export lease (its MoRef value) to what it serves, from ExportVm or
// ExportSnapshot until HttpNfcLeaseComplete or HttpNfcLeaseAbort.
var exports sync.Map

var (
	cloneCall     = regexp.MustCompile(`<CloneVM_Task\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	revertCall    = regexp.MustCompile(`<RevertToSnapshot_Task\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	reconfigCall  = regexp.MustCompile(`<ReconfigVM_Task\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	linkedClone   = regexp.MustCompile(`<diskMoveType>createNewChildDiskBacking</diskMoveType>`)
	cloneSnapshot = regexp.MustCompile(`<snapshot\b[^>]*>([^<]+)</snapshot>`)
	returnedTask  = regexp.MustCompile(`<returnval\b[^>]*>(task-[^<]+)</returnval>`)
	createCall    = regexp.MustCompile(`<CreateVM_Task\b`)
	importCall    = regexp.MustCompile(`<ImportVApp\b`)
	leaseEndCall  = regexp.MustCompile(`<HttpNfcLease(Complete|Abort)\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	exportCall    = regexp.MustCompile(`<Export(Vm|Snapshot)\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	destroyCall   = regexp.MustCompile(`<Destroy_Task\b[^>]*>\s*<_this[^>]*>([^<]+)</_this>`)
	returnedRef   = regexp.MustCompile(`<returnval\b[^>]*>([^<]+)</returnval>`)
)

func main() {
	model := simulator.VPX()
	flag.IntVar(&model.Datacenter, "dc", model.Datacenter, "number of datacenters")
	flag.IntVar(&model.Cluster, "cluster", model.Cluster, "clusters per datacenter")
	flag.IntVar(&model.ClusterHost, "cluster-host", model.ClusterHost, "hosts per cluster")
	flag.IntVar(&model.Host, "host", model.Host, "standalone hosts per datacenter")
	flag.IntVar(&model.Machine, "vm", model.Machine, "VMs per resource pool")
	flag.IntVar(&model.Datastore, "ds", model.Datastore, "datastores per datacenter")
	port := flag.Int("port", 0, "port on 127.0.0.1 (0: any free port)")
	username := flag.String("username", "user", "login user name")
	password := flag.String("password", "pass", "login password")
	idle := flag.Duration("idle-timeout", 0, "expire sessions idle this long (0: never)")
	held := flag.Bool("held-task", false, "make a task that never finishes; print its MoRef second")
	delays := flag.String("method-delay", "", "delay SOAP methods before they run: Name=ms[,Name=ms]")
	flag.Parse()
	model.DelayConfig.MethodDelay = methodDelays(*delays)

	simulator.SessionIdleTimeout = *idle
	if err := model.Create(); err != nil {
		log.Fatalf("vcsim-launcher: building the inventory: %v", err)
	}
	defer model.Remove()
	useCollector()

	model.Service.TLS = new(tls.Config)
	model.Service.Listen = &url.URL{
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)),
		User: url.UserPassword(*username, *password),
	}
	server := model.Service.NewServer()
	defer server.Close()
	// No client can connect before the URL is printed, so swapping the handler here is safe.
	server.Config.Handler = corrected{server.Config.Handler}

	fmt.Println(server.URL.String())
	if *held {
		fmt.Println(runningTask().Value)
	}
	_ = os.Stdout.Sync()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}

// methodDelays parses -method-delay: a test holds one step of a Create open this way.
func methodDelays(spec string) map[string]int {
	delays := map[string]int{}
	for _, entry := range strings.Split(spec, ",") {
		if entry == "" {
			continue
		}
		name, ms, found := strings.Cut(entry, "=")
		milliseconds, err := strconv.Atoi(ms)
		if !found || err != nil {
			log.Fatalf("vcsim-launcher: -method-delay entry %q is not Name=milliseconds", entry)
		}
		delays[name] = milliseconds
	}
	return delays
}

// corrected wraps the simulator's HTTP handler to fix the SOAP methods and NFC uploads above.
type corrected struct{ next http.Handler }

func (c corrected) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/nfc/") && (r.Method == http.MethodPut || r.Method == http.MethodPost) {
		if receiveUpload(w, r) {
			return
		}
	}
	if strings.HasPrefix(r.URL.Path, "/nfc/") && r.Method == http.MethodGet && serveExport(w, r) {
		return
	}
	if r.URL.Path != "/sdk" { // datastore files and NFC transfers pass whole, whatever their size
		c.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if m := cloneCall.FindSubmatch(body); m != nil {
		c.cloneWithOwnDevices(w, r, string(m[1]), body)
		return
	}
	switch {
	case createCall.Match(body):
		c.createWithUniqueName(w, r, body)
		return
	case importCall.Match(body):
		c.importWithUploads(w, r, body)
		return
	}
	if m := destroyCall.FindSubmatch(body); m != nil {
		c.destroyWithDisks(w, r, string(m[1]))
		return
	}
	if m := exportCall.FindSubmatch(body); m != nil {
		c.exportDisks(w, r, string(m[1]), string(m[2]))
		return
	}
	if m := leaseEndCall.FindSubmatch(body); m != nil {
		uploads.Delete(string(m[2]))
		c.endLease(w, r, string(m[1]), string(m[2]))
		return
	}
	c.next.ServeHTTP(w, r)
	if m := revertCall.FindSubmatch(body); m != nil {
		restoreSnapshotHardware(string(m[1]))
	}
	if m := reconfigCall.FindSubmatch(body); m != nil {
		forgetRemovedNICs(string(m[1]))
	}
}

// runningTask is a reconfigure of some VM that started and never ends.
func runningTask() types.ManagedObjectReference {
	vm := simulator.Map.Any("VirtualMachine")
	task := simulator.CreateTask(vm, "reconfigVm", func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
		return nil, nil
	})
	simulator.Map.Update(task, []types.PropertyChange{{Name: "info.state", Val: types.TaskInfoStateRunning}})
	return task.Self
}

// recorder keeps a copy of the response body while passing it on.
type recorder struct {
	http.ResponseWriter
	body bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.body.Write(p)
	return r.ResponseWriter.Write(p)
}

// cloneWithOwnDevices lets the clone take deep copies of the source's devices, not the
// originals; a linked clone's disks then get the snapshot's disks as parents.
func (c corrected) cloneWithOwnDevices(w http.ResponseWriter, r *http.Request, vmID string, body []byte) {
	ref := types.ManagedObjectReference{Type: "VirtualMachine", Value: vmID}
	vm, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine)
	request := cloneRequest(body)
	if !ok || request == nil {
		c.next.ServeHTTP(w, r)
		return
	}
	clones.Lock()
	defer clones.Unlock()
	if existing, taken := namedVM(request.Folder, request.Name); taken {
		refuseTask(w, vm, "CloneVM_Task", &types.DuplicateName{Name: request.Name, Object: existing})
		return
	}
	var original []types.BaseVirtualDevice
	simulator.Map.WithLock(vm, func() {
		original = vm.Config.Hardware.Device
		vm.Config.Hardware.Device = deepCopy(reflect.ValueOf(original)).Interface().([]types.BaseVirtualDevice)
	})
	response := &recorder{ResponseWriter: w}
	func() {
		defer simulator.Map.WithLock(vm, func() { vm.Config.Hardware.Device = original })
		c.next.ServeHTTP(response, r)
	}()
	snapshot := cloneSnapshot.FindSubmatch(body)
	task := returnedTask.FindSubmatch(response.body.Bytes())
	if task == nil {
		return
	}
	if linkedClone.Match(body) && snapshot != nil {
		linkDisks(string(task[1]), string(snapshot[1]))
	}
	finishClone(vm, string(task[1]), request.Spec)
}

// cloneRequest decodes the CloneVM_Task call (nil when it does not decode).
func cloneRequest(body []byte) *types.CloneVM_Task {
	method, err := simulator.UnmarshalBody(types.TypeFunc(), body)
	if err != nil {
		return nil
	}
	request, _ := method.Body.(*types.CloneVM_Task)
	return request
}

// namedVM is the VM of that name the folder already holds, if any.
func namedVM(folderRef types.ManagedObjectReference, name string) (types.ManagedObjectReference, bool) {
	folder, ok := simulator.Map.Get(folderRef).(*simulator.Folder)
	if !ok {
		return types.ManagedObjectReference{}, false
	}
	for _, child := range folder.ChildEntity {
		if vm, ok := simulator.Map.Get(child).(*simulator.VirtualMachine); ok && vm.Name == name {
			return child, true
		}
	}
	return types.ManagedObjectReference{}, false
}

// refuseTask answers the call to method with a task that failed with fault, as vCenter does.
func refuseTask(w http.ResponseWriter, entity mo.Reference, method string, fault types.BaseMethodFault) {
	task := simulator.CreateTask(entity, method, func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
		return nil, fault
	})
	answer(w, method, task.Run())
}

// answer writes the SOAP response of a call to method that returns the MoRef.
func answer(w http.ResponseWriter, method string, ref types.ManagedObjectReference) {
	envelope(w, http.StatusOK, fmt.Sprintf(
		`<%[1]sResponse xmlns="urn:vim25"><returnval type="%[2]s">%[3]s</returnval></%[1]sResponse>`,
		method, ref.Type, ref.Value))
}

// refuse writes a SOAP fault as the simulator does: the detail element is named after the
// fault's type, which its xsi:type gives.
func refuse(w http.ResponseWriter, message string, fault types.BaseMethodFault) {
	kind := reflect.TypeOf(fault).Elem().Name()
	var detail, text bytes.Buffer
	start := xml.StartElement{Name: xml.Name{Local: kind + "Fault"}, Attr: []xml.Attr{
		{Name: xml.Name{Local: "xmlns"}, Value: "urn:vim25"},
		{Name: xml.Name{Local: "xsi:type"}, Value: kind},
	}}
	if err := xml.NewEncoder(&detail).EncodeElement(fault, start); err != nil {
		log.Printf("encoding %s: %s", kind, err)
	}
	_ = xml.EscapeText(&text, []byte(message))
	envelope(w, http.StatusInternalServerError, `<soapenv:Fault><faultcode>ServerFaultCode</faultcode>`+
		`<faultstring>`+text.String()+`</faultstring><detail>`+detail.String()+`</detail></soapenv:Fault>`)
}

func envelope(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?>`+
		`<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" `+
		`xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">`+
		`<soapenv:Body>`+body+`</soapenv:Body></soapenv:Envelope>`)
}

// createWithUniqueName fails the CreateVM_Task with DuplicateName when the folder already
// holds a VM of that name, as vCenter does (the simulator makes a second one).
func (c corrected) createWithUniqueName(w http.ResponseWriter, r *http.Request, body []byte) {
	method, err := simulator.UnmarshalBody(types.TypeFunc(), body)
	request, ok := method.Body.(*types.CreateVM_Task)
	if err != nil || !ok {
		c.next.ServeHTTP(w, r)
		return
	}
	clones.Lock()
	defer clones.Unlock()
	if existing, taken := namedVM(request.This, request.Config.Name); taken {
		folder := simulator.Map.Get(request.This)
		refuseTask(w, folder, "CreateVM_Task", &types.DuplicateName{Name: request.Config.Name, Object: existing})
		return
	}
	c.next.ServeHTTP(w, r)
}

// importWithUploads notes which datastore file each device URL of the import lease names, so
// that receiveUpload can write the bytes there.
func (c corrected) importWithUploads(w http.ResponseWriter, r *http.Request, body []byte) {
	method, err := simulator.UnmarshalBody(types.TypeFunc(), body)
	var spec *types.VirtualMachineImportSpec
	if request, ok := method.Body.(*types.ImportVApp); err == nil && ok {
		spec, _ = request.Spec.(*types.VirtualMachineImportSpec)
	}
	if spec == nil {
		c.next.ServeHTTP(w, r)
		return
	}
	clones.Lock()
	defer clones.Unlock()
	before := vmsNamed(spec.ConfigSpec.Name)
	response := &recorder{ResponseWriter: w}
	c.next.ServeHTTP(response, r)
	lease := returnedRef.FindSubmatch(response.body.Bytes())
	if lease == nil {
		return
	}
	for ref, vm := range vmsNamed(spec.ConfigSpec.Name) {
		if _, existed := before[ref]; !existed {
			uploads.Store(string(lease[1]), deviceFiles(vm))
		}
	}
}

// receiveUpload writes an import lease's upload into the device's file; false when the lease
// or device is not one an import noted (the simulator then answers as it would).
func receiveUpload(w http.ResponseWriter, r *http.Request) bool {
	lease, name := leaseFile(r.URL.Path)
	files, ok := uploads.Load(lease)
	if !ok {
		return false
	}
	file, ok := files.(map[string]string)[name]
	if !ok {
		return false
	}
	f, err := os.Create(file)
	if err == nil {
		_, err = io.Copy(f, r.Body)
		if closeErr := f.Close(); err == nil {
			err = closeErr
		}
	}
	if err != nil {
		log.Printf("nfc %s %s: %s", r.Method, file, err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return true
	}
	w.WriteHeader(http.StatusOK)
	return true
}

// leaseFile splits an NFC URL path, /nfc/<lease>/<file>, into the lease and the file name.
func leaseFile(urlPath string) (string, string) {
	lease, file := path.Split(urlPath)
	return path.Base(lease), file
}

// vmsNamed is every VM of that name, by MoRef value.
func vmsNamed(name string) map[string]*simulator.VirtualMachine {
	found := map[string]*simulator.VirtualMachine{}
	for _, entity := range simulator.Map.All("VirtualMachine") {
		if vm, ok := entity.(*simulator.VirtualMachine); ok && vm.Name == name {
			found[vm.Self.Value] = vm
		}
	}
	return found
}

// deviceFiles maps the base name of each device's backing file (what an NFC device URL ends
// with) to its path on the host, as the simulator's ImportVApp names them.
func deviceFiles(vm *simulator.VirtualMachine) map[string]string {
	files := map[string]string{}
	for _, device := range vm.Config.Hardware.Device {
		info, ok := device.GetVirtualDevice().Backing.(types.BaseVirtualDeviceFileBackingInfo)
		if !ok {
			continue
		}
		if local := localPath(info.GetVirtualDeviceFileBackingInfo().FileName); local != "" {
			files[path.Base(local)] = local
		}
	}
	return files
}

// localPath is where a "[datastore] dir/file" path lives on the host ("" if nowhere).
func localPath(datastorePath string) string {
	var file object.DatastorePath
	if !file.FromString(datastorePath) {
		return ""
	}
	for _, entity := range simulator.Map.All("Datastore") {
		if ds, ok := entity.(*simulator.Datastore); ok && ds.Name == file.Datastore {
			return path.Join(ds.Info.GetDatastoreInfo().Url, file.Path)
		}
	}
	return ""
}

// exportLease is what an export lease serves, by the file name its device URLs end with, and
// the export task vCenter shows for it.
type exportLease struct {
	task  *simulator.Task
	disks map[string]exportedDisk
}

// exportedDisk is one disk of an export: its files on the host, its own first, then its
// parents' (a delta disk the simulator left blank reads through to its parent), and its size.
type exportedDisk struct {
	files    []string
	capacity int64
}

// exportDisks answers ExportVm and ExportSnapshot, which the simulator lacks, as vCenter does:
// a VM that is not powered off cannot be exported (InvalidPowerState; a snapshot can be, in
// any power state); otherwise a ready HttpNfcLease with one device URL per disk, in device
// order, and a running export task.
func (c corrected) exportDisks(w http.ResponseWriter, r *http.Request, method, id string) {
	// The simulator answers first: its NotAuthenticated or ManagedObjectNotFound stand as they are.
	probe := httptest.NewRecorder()
	c.next.ServeHTTP(probe, r)
	vm, snapshot := exportSource(method, id)
	if vm == nil || !bytes.Contains(probe.Body.Bytes(), []byte("MethodNotFound")) {
		for name, values := range probe.Header() {
			w.Header()[name] = values
		}
		w.WriteHeader(probe.Code)
		_, _ = w.Write(probe.Body.Bytes())
		return
	}
	var lease *simulator.HttpNfcLease
	var state types.VirtualMachinePowerState
	simulator.Map.WithLock(vm, func() {
		state = vm.Runtime.PowerState
		devices := vm.Config.Hardware.Device
		if snapshot != nil {
			devices = snapshot.Config.Hardware.Device
		} else if state != types.VirtualMachinePowerStatePoweredOff {
			return
		}
		lease = newExportLease(vm, "export"+method, devices)
	})
	if lease == nil {
		refuse(w, "The attempted operation cannot be performed in the current state ("+string(state)+").",
			&types.InvalidPowerState{RequestedState: types.VirtualMachinePowerStatePoweredOff, ExistingState: state})
		return
	}
	answer(w, "Export"+method, lease.Self)
}

// exportSource is the VM whose disks ExportVm or ExportSnapshot serves, and for ExportSnapshot
// the snapshot (nil VM when the call names none: the simulator's answer says so).
func exportSource(method, id string) (*simulator.VirtualMachine, *simulator.VirtualMachineSnapshot) {
	if method == "Snapshot" {
		ref := types.ManagedObjectReference{Type: "VirtualMachineSnapshot", Value: id}
		snapshot, ok := simulator.Map.Get(ref).(*simulator.VirtualMachineSnapshot)
		if !ok {
			return nil, nil
		}
		vm, _ := simulator.Map.Get(snapshot.Vm).(*simulator.VirtualMachine)
		return vm, snapshot
	}
	vm, _ := simulator.Map.Get(types.ManagedObjectReference{Type: "VirtualMachine", Value: id}).(*simulator.VirtualMachine)
	return vm, nil
}

// newExportLease makes the lease of an export of these disks of the VM, with its running task
// (on the VM, for a snapshot too: a task's entity is a managed entity); its device URLs end
// with disk-<n>.vmdk, as vCenter's do.
func newExportLease(vm *simulator.VirtualMachine, task string, devices []types.BaseVirtualDevice) *simulator.HttpNfcLease {
	lease := &simulator.HttpNfcLease{HttpNfcLease: mo.HttpNfcLease{
		Info:  &types.HttpNfcLeaseInfo{Entity: vm.Self, LeaseTimeout: 300},
		State: types.HttpNfcLeaseStateReady,
	}}
	simulator.Map.Put(lease)
	lease.Info.Lease = lease.Self
	export := exportLease{disks: map[string]exportedDisk{}}
	for _, device := range devices {
		disk, ok := device.(*types.VirtualDisk)
		if !ok {
			continue
		}
		n := len(export.disks)
		name := fmt.Sprintf("disk-%d.vmdk", n)
		exported := exportedDisk{capacity: disk.CapacityInBytes}
		if exported.capacity == 0 {
			exported.capacity = disk.CapacityInKB * 1024
		}
		for backing := diskBacking(disk); backing != nil; backing = backing.Parent {
			exported.files = append(exported.files, localPath(backing.FileName))
		}
		export.disks[name] = exported
		_, size := exported.content()
		lease.Info.TotalDiskCapacityInKB += exported.capacity / 1024
		lease.Info.DeviceUrl = append(lease.Info.DeviceUrl, types.HttpNfcLeaseDeviceUrl{
			Key:       fmt.Sprintf("/%s/disk:%d", vm.Self.Value, n),
			ImportKey: fmt.Sprintf("/%s/disk:%d", vm.Name, n),
			Url:       (&url.URL{Scheme: "https", Host: "*", Path: path.Join("/nfc", lease.Self.Value, name)}).String(),
			Disk:      types.NewBool(true),
			TargetId:  name,
			FileSize:  size,
		})
	}
	export.task = simulator.CreateTask(vm, task, nil)
	simulator.Map.Update(export.task, []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	exports.Store(lease.Self.Value, export)
	return lease
}

// diskBacking is the disk's file backing (nil for a kind the simulator does not make).
func diskBacking(disk *types.VirtualDisk) *types.VirtualDiskFlatVer2BackingInfo {
	backing, _ := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
	return backing
}

// content is the file to serve (the first of the chain that holds bytes, "" for none: the disk
// was never written) and its size.
func (d exportedDisk) content() (string, int64) {
	for _, file := range d.files {
		if info, err := os.Stat(file); err == nil && info.Size() > 0 {
			return file, info.Size()
		}
	}
	return "", int64(len(blankStreamVMDK(d.capacity)))
}

// serveExport answers a GET of an export lease's device URL with the disk as a streamOptimized
// vmdk; false when the lease is not an export lease (the simulator then answers).
func serveExport(w http.ResponseWriter, r *http.Request) bool {
	lease, name := leaseFile(r.URL.Path)
	export, ok := exports.Load(lease)
	if !ok {
		return false
	}
	disk, ok := export.(exportLease).disks[name]
	if !ok {
		http.NotFound(w, r)
		return true
	}
	file, size := disk.content()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	if file == "" {
		_, _ = w.Write(blankStreamVMDK(disk.capacity))
		return true
	}
	f, err := os.Open(file)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return true
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		log.Printf("nfc GET %s: %s", file, err)
	}
	return true
}

// endLease lets the simulator complete or abort the lease, then, for an export lease, ends its
// task (success on HttpNfcLeaseComplete, RequestCanceled on HttpNfcLeaseAbort) and removes the
// lease, which vCenter no longer knows once it is complete or aborted.
func (c corrected) endLease(w http.ResponseWriter, r *http.Request, method, id string) {
	response := &recorder{ResponseWriter: w}
	c.next.ServeHTTP(response, r)
	export, ok := exports.Load(id)
	if !ok || !bytes.Contains(response.body.Bytes(), []byte("HttpNfcLease"+method+"Response")) {
		return
	}
	exports.Delete(id)
	changes := []types.PropertyChange{
		{Name: "info.completeTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateSuccess},
	}
	if method == "Abort" {
		changes[1].Val = types.TaskInfoStateError
		changes = append(changes, types.PropertyChange{Name: "info.error", Val: types.LocalizedMethodFault{
			Fault: &types.RequestCanceled{}, LocalizedMessage: "The task was canceled by a user.",
		}})
	}
	simulator.Map.Update(export.(exportLease).task, changes)
	simulator.Map.Remove(types.ManagedObjectReference{Type: "HttpNfcLease", Value: id})
}

const (
	sector       = 512
	grainSectors = 128 // 64 KiB grains, as vCenter and qemu-img write them
	gtEntries    = 512 // grain table entries: one grain table covers 32 MiB
	descSectors  = 20
	overhead     = 128 // header and descriptor take the first grain's room
)

// sparseHeader is the VMDK sparse extent header (little-endian, packed) of VMware's Virtual
// Disk Format 5.0.
type sparseHeader struct {
	Magic              uint32
	Version            uint32
	Flags              uint32
	Capacity           uint64
	GrainSize          uint64
	DescriptorOffset   uint64
	DescriptorSize     uint64
	NumGTEsPerGT       uint32
	RgdOffset          uint64
	GdOffset           uint64
	OverHead           uint64
	UncleanShutdown    uint8
	SingleEndLineChar  uint8
	NonEndLineChar     uint8
	DoubleEndLineChar1 uint8
	DoubleEndLineChar2 uint8
	CompressAlgorithm  uint16
}

// streamMarker starts each metadata block of a streamOptimized vmdk: Val counts its sectors
// (Size 0 tells it from a grain).
type streamMarker struct {
	Val        uint64
	Size, Type uint32
}

// blankStreamVMDK is the streamOptimized vmdk of a disk of that capacity that holds no grains,
// as vCenter exports a disk never written: the header (grain directory at the end), the
// descriptor, the grain directory marker and an all-zero directory (no grain tables: every
// grain reads as zeros), then the footer (the header with the directory's offset) and the
// end-of-stream marker, each sector-aligned.
func blankStreamVMDK(capacity int64) []byte {
	sectors := uint64((capacity + sector - 1) / sector)
	gdEntries := (sectors + grainSectors*gtEntries - 1) / (grainSectors * gtEntries)
	gdSectors := (gdEntries*4 + sector - 1) / sector
	header := sparseHeader{
		Magic:              0x564d444b, // "KDMV"
		Version:            3,
		Flags:              1 | 1<<16 | 1<<17, // newline test, compressed grains, markers
		Capacity:           sectors,
		GrainSize:          grainSectors,
		DescriptorOffset:   1,
		DescriptorSize:     descSectors,
		NumGTEsPerGT:       gtEntries,
		GdOffset:           ^uint64(0), // in the footer
		OverHead:           overhead,
		SingleEndLineChar:  '\n',
		NonEndLineChar:     ' ',
		DoubleEndLineChar1: '\r',
		DoubleEndLineChar2: '\n',
		CompressAlgorithm:  1, // deflate
	}
	var out bytes.Buffer
	put := func(v interface{}) {
		start := out.Len()
		_ = binary.Write(&out, binary.LittleEndian, v)
		out.Write(make([]byte, (sector-(out.Len()-start)%sector)%sector))
	}
	marker := func(val uint64, kind uint32) { put(streamMarker{Val: val, Type: kind}) }
	put(header)
	cylinders := sectors / (16 * 63)
	if cylinders > 16383 {
		cylinders = 16383
	}
	out.WriteString(fmt.Sprintf("# Disk DescriptorFile\nversion=1\nCID=%08x\nparentCID=ffffffff\n"+
		"createType=\"streamOptimized\"\n\n# Extent description\nRW %d SPARSE \"disk.vmdk\"\n\n"+
		"# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\nddb.geometry.cylinders = \"%d\"\n"+
		"ddb.geometry.heads = \"16\"\nddb.geometry.sectors = \"63\"\nddb.adapterType = \"lsilogic\"\n",
		crc32.ChecksumIEEE([]byte(strconv.FormatUint(sectors, 10))), sectors, cylinders))
	out.Write(make([]byte, overhead*sector-out.Len()))
	marker(gdSectors, 2) // grain directory
	out.Write(make([]byte, gdSectors*sector))
	marker(1, 3) // footer
	header.GdOffset = overhead + 1
	put(header)
	marker(0, 0) // end of stream
	return out.Bytes()
}

// destroyWithDisks deletes, once the VM is destroyed, the disk files it had attached outside
// its home directory (which the simulator deletes), as vCenter does.
func (c corrected) destroyWithDisks(w http.ResponseWriter, r *http.Request, vmID string) {
	vm, ok := simulator.Map.Get(types.ManagedObjectReference{Type: "VirtualMachine", Value: vmID}).(*simulator.VirtualMachine)
	if !ok {
		c.next.ServeHTTP(w, r)
		return
	}
	var disks []string
	simulator.Map.WithLock(vm, func() {
		for _, backing := range diskBackings(vm.Config.Hardware.Device) {
			if local := localPath(backing.FileName); local != "" {
				disks = append(disks, local, strings.Replace(local, ".vmdk", "-flat.vmdk", 1))
			}
		}
	})
	response := &recorder{ResponseWriter: w}
	c.next.ServeHTTP(response, r)
	m := returnedTask.FindSubmatch(response.body.Bytes())
	if m == nil {
		return
	}
	task, ok := simulator.Map.Get(types.ManagedObjectReference{Type: "Task", Value: string(m[1])}).(*simulator.Task)
	if !ok || task.Info.State != types.TaskInfoStateSuccess {
		return
	}
	for _, disk := range disks {
		_ = os.Remove(disk)
	}
}

// finishClone applies what the simulator's clone ignores: the spec's hardware settings, then
// its customization (which fails the clone task, and removes the clone, when it does not fit).
// A disk edit in the spec names the source's disk, which vCenter applies to the clone's copy;
// the simulator points the clone at the source's file instead (so destroying the clone would
// delete the source's disk): such disks are pointed back at the clone's own files.
func finishClone(source *simulator.VirtualMachine, taskID string, spec types.VirtualMachineCloneSpec) {
	task, ok := simulator.Map.Get(types.ManagedObjectReference{Type: "Task", Value: taskID}).(*simulator.Task)
	if !ok {
		return
	}
	cloneRef, ok := task.Info.Result.(types.ManagedObjectReference)
	if !ok {
		return
	}
	clone, ok := simulator.Map.Get(cloneRef).(*simulator.VirtualMachine)
	if !ok {
		return
	}
	simulator.Map.WithLock(clone, func() { ownDisks(source, clone) })
	if config := spec.Config; config != nil {
		simulator.Map.WithLock(clone, func() { applyHardware(clone, config) })
	}
	forgetRemovedNICs(cloneRef.Value)
	if spec.Customization == nil {
		return
	}
	started, ok := clone.CustomizeVMTask(&types.CustomizeVM_Task{This: cloneRef, Spec: *spec.Customization}).(*methods.CustomizeVM_TaskBody)
	if !ok {
		return
	}
	customized, ok := simulator.Map.Get(started.Res.Returnval).(*simulator.Task)
	if !ok || customized.Info.Error == nil {
		return
	}
	removeVM(clone)
	simulator.Map.Update(task, []types.PropertyChange{
		{Name: "info.state", Val: types.TaskInfoStateError},
		{Name: "info.result", Val: nil},
		{Name: "info.error", Val: *customized.Info.Error},
	})
}

// ownDisks moves the clone's disk backings out of the source's directory into the clone's.
func ownDisks(source, clone *simulator.VirtualMachine) {
	from := path.Dir(source.Config.Files.VmPathName) + "/"
	to := path.Dir(clone.Config.Files.VmPathName) + "/"
	for _, backing := range diskBackings(clone.Config.Hardware.Device) {
		if strings.HasPrefix(backing.FileName, from) {
			backing.FileName = to + strings.TrimPrefix(backing.FileName, from)
		}
	}
}

// applyHardware sets what a reconfigure with the clone spec's config would set.
func applyHardware(vm *simulator.VirtualMachine, config *types.VirtualMachineConfigSpec) {
	if config.NumCPUs != 0 {
		vm.Config.Hardware.NumCPU = config.NumCPUs
		vm.Summary.Config.NumCpu = config.NumCPUs
	}
	if config.MemoryMB != 0 {
		vm.Config.Hardware.MemoryMB = int32(config.MemoryMB)
		vm.Summary.Config.MemorySizeMB = int32(config.MemoryMB)
	}
	if config.Firmware != "" {
		vm.Config.Firmware = config.Firmware
	}
	if config.BootOptions != nil {
		vm.Config.BootOptions = config.BootOptions
	}
	for _, flag := range []struct {
		src *bool
		dst **bool
	}{
		{config.NestedHVEnabled, &vm.Config.NestedHVEnabled},
		{config.CpuHotAddEnabled, &vm.Config.CpuHotAddEnabled},
		{config.MemoryHotAddEnabled, &vm.Config.MemoryHotAddEnabled},
	} {
		if flag.src != nil {
			*flag.dst = flag.src
		}
	}
}

// removeVM takes a clone out of the inventory again, as vCenter does with a failed clone.
func removeVM(vm *simulator.VirtualMachine) {
	if folder, ok := simulator.Map.Get(*vm.Parent).(*simulator.Folder); ok {
		simulator.Map.RemoveReference(folder, &folder.ChildEntity, vm.Self)
	}
	if pool, ok := simulator.Map.Get(*vm.ResourcePool).(*simulator.ResourcePool); ok {
		simulator.Map.RemoveReference(pool, &pool.Vm, vm.Self)
	}
	if host, ok := simulator.Map.Get(*vm.Runtime.Host).(*simulator.HostSystem); ok {
		simulator.Map.RemoveReference(host, &host.Vm, vm.Self)
	}
	simulator.Map.Remove(vm.Self)
}

// linkDisks gives each disk of the clone the clone task made the matching snapshot disk as parent.
func linkDisks(taskID, snapshotID string) {
	task, ok := simulator.Map.Get(types.ManagedObjectReference{Type: "Task", Value: taskID}).(*simulator.Task)
	if !ok {
		return
	}
	cloneRef, ok := task.Info.Result.(types.ManagedObjectReference)
	if !ok {
		return
	}
	clone, ok := simulator.Map.Get(cloneRef).(*simulator.VirtualMachine)
	snapshotRef := types.ManagedObjectReference{Type: "VirtualMachineSnapshot", Value: snapshotID}
	snapshot, found := simulator.Map.Get(snapshotRef).(*simulator.VirtualMachineSnapshot)
	if !ok || !found {
		return
	}
	parents := diskBackings(snapshot.Config.Hardware.Device)
	simulator.Map.WithLock(clone, func() {
		for i, backing := range diskBackings(clone.Config.Hardware.Device) {
			if i < len(parents) {
				backing.Parent = &types.VirtualDiskFlatVer2BackingInfo{
					VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: parents[i].FileName},
				}
			}
		}
	})
}

func diskBackings(devices []types.BaseVirtualDevice) []*types.VirtualDiskFlatVer2BackingInfo {
	var backings []*types.VirtualDiskFlatVer2BackingInfo
	for _, device := range devices {
		if disk, ok := device.(*types.VirtualDisk); ok {
			if backing, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo); ok {
				backings = append(backings, backing)
			}
		}
	}
	return backings
}

// forgetRemovedNICs drops guest.net entries whose NIC the VM no longer has.
func forgetRemovedNICs(vmID string) {
	ref := types.ManagedObjectReference{Type: "VirtualMachine", Value: vmID}
	vm, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine)
	if !ok {
		return
	}
	simulator.Map.WithLock(vm, func() {
		present := map[int32]bool{}
		for _, device := range vm.Config.Hardware.Device {
			if nic, ok := device.(types.BaseVirtualEthernetCard); ok {
				present[nic.GetVirtualEthernetCard().Key] = true
			}
		}
		kept := vm.Guest.Net[:0]
		for _, nic := range vm.Guest.Net {
			if present[nic.DeviceConfigId] {
				kept = append(kept, nic)
			}
		}
		vm.Guest.Net = kept
	})
}

// restoreSnapshotHardware puts back the CPU and memory the snapshot recorded.
func restoreSnapshotHardware(snapshotID string) {
	ref := types.ManagedObjectReference{Type: "VirtualMachineSnapshot", Value: snapshotID}
	snapshot, ok := simulator.Map.Get(ref).(*simulator.VirtualMachineSnapshot)
	if !ok {
		return
	}
	vm, ok := simulator.Map.Get(snapshot.Vm).(*simulator.VirtualMachine)
	if !ok {
		return
	}
	simulator.Map.WithLock(vm, func() {
		vm.Config.Hardware.NumCPU = snapshot.Config.Hardware.NumCPU
		vm.Config.Hardware.MemoryMB = snapshot.Config.Hardware.MemoryMB
		vm.Summary.Config.NumCpu = snapshot.Config.Hardware.NumCPU
		vm.Summary.Config.MemorySizeMB = snapshot.Config.Hardware.MemoryMB
	})
}

// deepCopy copies pointers, interfaces, slices and maps all the way down (device specs are trees).
func deepCopy(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Ptr:
		if v.IsNil() {
			return v
		}
		c := reflect.New(v.Elem().Type())
		c.Elem().Set(deepCopy(v.Elem()))
		return c
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		c := reflect.New(v.Type()).Elem()
		c.Set(deepCopy(v.Elem()))
		return c
	case reflect.Slice:
		if v.IsNil() {
			return v
		}
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := 0; i < v.Len(); i++ {
			c.Index(i).Set(deepCopy(v.Index(i)))
		}
		return c
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		c := reflect.MakeMapWithSize(v.Type(), v.Len())
		for _, key := range v.MapKeys() {
			c.SetMapIndex(key, deepCopy(v.MapIndex(key)))
		}
		return c
	case reflect.Struct:
		c := reflect.New(v.Type()).Elem()
		c.Set(v) // keeps unexported fields (time.Time) as they are
		for i := 0; i < v.NumField(); i++ {
			if c.Field(i).CanSet() {
				c.Field(i).Set(deepCopy(v.Field(i)))
			}
		}
		return c
	default:
		return v
	}
}

// collector is the simulator's PropertyCollector with WaitForUpdatesEx answered as vCenter
// does. The simulator's own answers every object update it dispatches by collecting each
// filter's whole spec again (at 10,000 VMs, seconds per change) and ignores maxObjectUpdates
// (the first update set of a large view comes in one answer). This one keeps, per filter, the
// objects it has reported: a change to one of them sends the filter's properties that change
// touched, read afresh from that object alone; the filter's object set is walked again (the
// references only) when a property it traverses changes or one of its objects is removed; and
// an update set larger than maxObjectUpdates is sent in pages marked truncated, each with a
// version that continues it.
//
// The simulator makes a session's collectors by instantiating the type registered for the
// root one, so collectors work from their zero value.
type collector struct {
	simulator.PropertyCollector

	polling  sync.Mutex // one WaitForUpdatesEx at a time; guards the fields below it
	version  int        // of the last update set answered
	backlog  []types.PropertyFilterUpdate
	reported map[types.ManagedObjectReference]map[types.ManagedObjectReference]struct{}

	mu     sync.Mutex // guards the fields below it (the registry calls the handlers)
	events []change
	wake   chan struct{}
	cancel context.CancelFunc
}

// change is what the registry told of an object: the properties it changed, or its removal.
type change struct {
	obj   types.ManagedObjectReference
	names []string
	gone  bool
}

// settle lets the rest of a burst (a task's creation, its states, the object it works on)
// arrive before a change is answered, so that the burst goes in one update set.
const settle = 20 * time.Millisecond

// useCollector makes every session's PropertyCollector a collector.
func useCollector() {
	root := simulator.Map.Get(vim25.ServiceInstance).(*simulator.ServiceInstance).Content.PropertyCollector
	pc := &collector{}
	pc.Self = root
	simulator.Map.Put(pc)
}

func (c *collector) CreatePropertyCollector(ctx *simulator.Context, r *types.CreatePropertyCollector) soap.HasFault {
	made := &collector{}
	made.Self.Type = "PropertyCollector" // the session names an object after its Go type otherwise
	return &methods.CreatePropertyCollectorBody{Res: &types.CreatePropertyCollectorResponse{
		Returnval: ctx.Session.Put(made).Reference(),
	}}
}

func (c *collector) DestroyPropertyCollector(ctx *simulator.Context, r *types.DestroyPropertyCollector) soap.HasFault {
	c.CancelWaitForUpdates(&types.CancelWaitForUpdates{This: r.This})
	ctx.Map.RemoveHandler(c)
	return c.PropertyCollector.DestroyPropertyCollector(ctx, r)
}

func (c *collector) CancelWaitForUpdates(r *types.CancelWaitForUpdates) soap.HasFault {
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	return &methods.CancelWaitForUpdatesBody{Res: new(types.CancelWaitForUpdatesResponse)}
}

// PutObject ignores a new object: it joins a filter only through a traversed property (a
// container view's "view" for one), whose change says so.
func (c *collector) PutObject(mo.Reference) {}

func (c *collector) UpdateObject(obj mo.Reference, changes []types.PropertyChange) {
	names := make([]string, len(changes))
	for i := range changes {
		names[i] = changes[i].Name
	}
	c.note(change{obj: obj.Reference(), names: names})
}

func (c *collector) RemoveObject(ref types.ManagedObjectReference) {
	c.note(change{obj: ref, gone: true})
}

func (c *collector) note(e change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// WaitForUpdates is the deprecated form: no options, so it waits until there is something.
func (c *collector) WaitForUpdates(ctx *simulator.Context, r *types.WaitForUpdates) soap.HasFault {
	body := &methods.WaitForUpdatesBody{}
	res := c.WaitForUpdatesEx(ctx, &types.WaitForUpdatesEx{This: r.This, Version: r.Version})
	if res.Fault() != nil {
		body.Fault_ = res.Fault()
	} else if set := res.(*methods.WaitForUpdatesExBody).Res.Returnval; set != nil {
		body.Res = &types.WaitForUpdatesResponse{Returnval: *set}
	}
	return body
}

func (c *collector) WaitForUpdatesEx(ctx *simulator.Context, r *types.WaitForUpdatesEx) soap.HasFault {
	c.polling.Lock()
	defer c.polling.Unlock()
	body := &methods.WaitForUpdatesExBody{Res: new(types.WaitForUpdatesExResponse)}

	wait, cancel := context.WithCancel(context.Background())
	once, limit := false, 0
	if options := r.Options; options != nil {
		limit = int(options.MaxObjectUpdates)
		if seconds := options.MaxWaitSeconds; seconds != nil {
			once = *seconds == 0
			if *seconds > 0 {
				wait, cancel = context.WithTimeout(context.Background(), time.Duration(*seconds)*time.Second)
			}
		}
	}
	defer cancel()
	c.mu.Lock()
	c.cancel = cancel
	if c.wake == nil {
		c.wake = make(chan struct{}, 1)
	}
	c.mu.Unlock()

	initial := r.Version == ""
	switch {
	case initial:
		c.restart(ctx)
	case r.Version != strconv.Itoa(c.version):
		body.Fault_ = simulator.Fault("version is not the last one returned", &types.InvalidArgument{InvalidProperty: "version"})
		body.Res = nil
		return body
	}
	for {
		if len(c.backlog) == 0 {
			updates, fault := c.changes(ctx)
			if fault != nil {
				body.Fault_ = simulator.Fault("", fault)
				body.Res = nil
				return body
			}
			c.backlog = updates
		}
		if len(c.backlog) != 0 || initial {
			body.Res.Returnval = c.page(limit)
			return body
		}
		if once {
			return body
		}
		select {
		case <-wait.Done():
			if wait.Err() == context.Canceled {
				body.Fault_ = simulator.Fault("", new(types.RequestCanceled))
				body.Res = nil
			}
			return body
		case <-c.wake:
			time.Sleep(settle)
		}
	}
}

// restart forgets what every filter reported and what was left to send: all is read again.
func (c *collector) restart(ctx *simulator.Context) {
	ctx.Map.AddHandler(c) // before reading, so that no change falls between the read and the listening
	c.mu.Lock()
	c.events = nil
	c.mu.Unlock()
	c.backlog = nil
	c.reported = make(map[types.ManagedObjectReference]map[types.ManagedObjectReference]struct{})
}

// page takes at most limit ObjectUpdates (all when limit is 0) off the backlog as the next
// update set, truncated when some are left.
func (c *collector) page(limit int) *types.UpdateSet {
	set := new(types.UpdateSet)
	for taken := 0; len(c.backlog) != 0 && (limit <= 0 || taken < limit); {
		update := &c.backlog[0]
		n := len(update.ObjectSet)
		if limit > 0 && n > limit-taken {
			n = limit - taken
		}
		set.FilterSet = append(set.FilterSet, types.PropertyFilterUpdate{Filter: update.Filter, ObjectSet: update.ObjectSet[:n]})
		update.ObjectSet = update.ObjectSet[n:]
		taken += n
		if len(update.ObjectSet) == 0 {
			c.backlog = c.backlog[1:]
		}
	}
	if len(c.backlog) != 0 {
		set.Truncated = types.NewBool(true)
	}
	c.version++
	set.Version = strconv.Itoa(c.version)
	return set
}

// changes turns the registry's changes since the last call into each filter's updates; a
// filter not seen before reports all its objects as entering.
func (c *collector) changes(ctx *simulator.Context) ([]types.PropertyFilterUpdate, types.BaseMethodFault) {
	c.mu.Lock()
	events := c.events
	c.events = nil
	c.mu.Unlock()

	var updates []types.PropertyFilterUpdate
	live := make(map[types.ManagedObjectReference]bool, len(c.Filter))
	for _, ref := range c.Filter {
		live[ref] = true
		filter, ok := ctx.Session.Get(ref).(*simulator.PropertyFilter)
		if !ok {
			continue
		}
		objects, fault := c.filterChanges(ctx, filter, events)
		if fault != nil {
			return nil, fault
		}
		if len(objects) != 0 {
			updates = append(updates, types.PropertyFilterUpdate{Filter: ref, ObjectSet: objects})
		}
	}
	for ref := range c.reported {
		if !live[ref] { // destroyed
			delete(c.reported, ref)
		}
	}
	return updates, nil
}

// filterChanges is one filter's share of the events: objects that entered its set (with its
// properties), left it, or changed properties it selects (those alone).
func (c *collector) filterChanges(ctx *simulator.Context, filter *simulator.PropertyFilter, events []change) ([]types.ObjectUpdate, types.BaseMethodFault) {
	reported, known := c.reported[filter.Self]
	if !known {
		reported = make(map[types.ManagedObjectReference]struct{})
		c.reported[filter.Self] = reported
		contents, fault := retrieve(ctx, filter.Spec)
		return entering(contents, reported), fault
	}

	traversed := traversedPaths(filter.Spec.ObjectSet)
	rewalk := false
	gone := make(map[types.ManagedObjectReference]bool)
	var touched []types.ManagedObjectReference
	names := make(map[types.ManagedObjectReference][]string)
	for _, e := range events {
		_, member := reported[e.obj]
		if e.gone {
			gone[e.obj] = true
			rewalk = rewalk || member
			continue
		}
		for _, name := range e.names {
			for _, path := range traversed {
				rewalk = rewalk || related(name, path)
			}
		}
		if member {
			if _, seen := names[e.obj]; !seen {
				touched = append(touched, e.obj)
			}
			names[e.obj] = append(names[e.obj], e.names...)
		}
	}

	var objects []types.ObjectUpdate
	if rewalk {
		members, fault := retrieve(ctx, types.PropertyFilterSpec{ObjectSet: filter.Spec.ObjectSet, PropSet: typesOnly(filter.Spec.PropSet)})
		if fault != nil {
			return nil, fault
		}
		present := make(map[types.ManagedObjectReference]bool, len(members))
		var arrived []types.ObjectSpec
		for _, member := range members {
			if gone[member.Obj] {
				continue
			}
			present[member.Obj] = true
			if _, ok := reported[member.Obj]; !ok {
				arrived = append(arrived, types.ObjectSpec{Obj: member.Obj})
			}
		}
		for ref := range reported {
			if !present[ref] {
				delete(reported, ref)
				objects = append(objects, types.ObjectUpdate{Obj: ref, Kind: types.ObjectUpdateKindLeave})
			}
		}
		if len(arrived) != 0 {
			contents, fault := retrieve(ctx, types.PropertyFilterSpec{ObjectSet: arrived, PropSet: filter.Spec.PropSet, ReportMissingObjectsInResults: types.NewBool(true)})
			if fault != nil {
				return nil, fault
			}
			objects = append(objects, entering(contents, reported)...)
		}
	}
	for _, ref := range touched {
		if _, ok := reported[ref]; !ok || gone[ref] {
			continue
		}
		update, fault := modified(ctx, ref, filter.Spec.PropSet, names[ref])
		if fault != nil {
			return nil, fault
		}
		if len(update.ChangeSet) != 0 {
			objects = append(objects, update)
		}
	}
	return objects, nil
}

// modified reads afresh the properties the filter selects that the named changes touched: a
// change inside a selected property sends the whole selected property, and a change that
// encloses one sends the selected one; a property now unset is sent without a value.
func modified(ctx *simulator.Context, ref types.ManagedObjectReference, specs []types.PropertySpec, names []string) (types.ObjectUpdate, types.BaseMethodFault) {
	update := types.ObjectUpdate{Obj: ref, Kind: types.ObjectUpdateKindModify}
	var selected []types.PropertySpec
	for _, spec := range specs {
		var paths []string
		for _, name := range names {
			if isTrue(spec.All) {
				paths = appendNew(paths, strings.SplitN(name, ".", 2)[0])
				continue
			}
			for _, path := range spec.PathSet {
				if related(name, path) {
					paths = appendNew(paths, path)
				}
			}
		}
		if len(paths) != 0 {
			selected = append(selected, types.PropertySpec{Type: spec.Type, PathSet: paths})
		}
	}
	if len(selected) == 0 {
		return update, nil
	}
	contents, fault := retrieve(ctx, types.PropertyFilterSpec{
		ObjectSet:                     []types.ObjectSpec{{Obj: ref}},
		PropSet:                       selected,
		ReportMissingObjectsInResults: types.NewBool(true),
	})
	if fault != nil || len(contents) == 0 {
		return update, fault
	}
	values := make(map[string]types.AnyType)
	for _, property := range contents[0].PropSet {
		values[property.Name] = property.Val
	}
	var sent []string
	for _, spec := range selected {
		for _, path := range spec.PathSet {
			if !contains(sent, path) && !missing(contents[0].MissingSet, path) {
				sent = append(sent, path)
				update.ChangeSet = append(update.ChangeSet, types.PropertyChange{Name: path, Op: types.PropertyChangeOpAssign, Val: values[path]})
			}
		}
	}
	return update, nil
}

// entering makes the objects' contents enter updates and notes them as reported.
func entering(contents []types.ObjectContent, reported map[types.ManagedObjectReference]struct{}) []types.ObjectUpdate {
	objects := make([]types.ObjectUpdate, 0, len(contents))
	for _, content := range contents {
		reported[content.Obj] = struct{}{}
		update := types.ObjectUpdate{Obj: content.Obj, Kind: types.ObjectUpdateKindEnter}
		for _, property := range content.PropSet {
			update.ChangeSet = append(update.ChangeSet, types.PropertyChange{Name: property.Name, Op: types.PropertyChangeOpAssign, Val: property.Val})
		}
		objects = append(objects, update)
	}
	return objects
}

// retrieve is RetrievePropertiesEx on the simulator's collector (unset properties left out).
func retrieve(ctx *simulator.Context, spec types.PropertyFilterSpec) ([]types.ObjectContent, types.BaseMethodFault) {
	res := new(simulator.PropertyCollector).RetrievePropertiesEx(ctx, &types.RetrievePropertiesEx{SpecSet: []types.PropertyFilterSpec{spec}})
	if fault := res.Fault(); fault != nil {
		if detail, ok := fault.VimFault().(types.BaseMethodFault); ok {
			return nil, detail
		}
		return nil, &types.SystemError{Reason: fault.String}
	}
	return res.(*methods.RetrievePropertiesExBody).Res.Returnval.Objects, nil
}

// typesOnly selects no property of the same types: what a filter covers, cheaply.
func typesOnly(specs []types.PropertySpec) []types.PropertySpec {
	kinds := make([]types.PropertySpec, len(specs))
	for i, spec := range specs {
		kinds[i] = types.PropertySpec{Type: spec.Type}
	}
	return kinds
}

// traversedPaths are the properties the object set's traversal specs follow.
func traversedPaths(objects []types.ObjectSpec) []string {
	var paths []string
	var visit func([]types.BaseSelectionSpec)
	visit = func(selections []types.BaseSelectionSpec) {
		for _, selection := range selections {
			if traversal, ok := selection.(*types.TraversalSpec); ok {
				paths = appendNew(paths, traversal.Path)
				visit(traversal.SelectSet)
			}
		}
	}
	for _, object := range objects {
		visit(object.SelectSet)
	}
	return paths
}

// related tells whether a change to one property path can change the other: the same path,
// or one inside the other.
func related(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(b, a+".")
}

func missing(set []types.MissingProperty, path string) bool {
	for _, property := range set {
		if property.Path == path {
			return true
		}
	}
	return false
}

func isTrue(b *bool) bool { return b != nil && *b }

func contains(list []string, s string) bool {
	for _, item := range list {
		if item == s {
			return true
		}
	}
	return false
}

func appendNew(list []string, s string) []string {
	if contains(list, s) {
		return list
	}
	return append(list, s)
}
