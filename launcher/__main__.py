"""The provisioned launcher's two stages, read as phases (docs/launcher.md).

Stage 1, ``stage1 STAGING_FD SOCKET_NAME [CGROUP_FD]``: started by the starter as root in the
host namespaces from the provisioned file, it meets the starter (rendezvous),
clones each capability into a detached read-only tree, seals its own source
into a memfd and starts the sandbox's pid 1 in new namespaces (reexec), born
in the cgroup v2 directory CGROUP_FD where the starter gave one, then
reports pid 1 and exits.

Stage 2, ``pid1 ...``: pid 1 of the sandbox, exec'd from the sealed memfd.
It verifies the memfd, imports everything it will ever need, waits for its
release, builds the filesystem (mounts), network and limits, exempts itself
from the OOM killer and joins a fresh session keyring, pivots, closes every
descriptor but the channel and the ops cgroup's, drops for good and proves
it (drop), installs the syscall filter and proves it (seccomp), sends READY,
and then runs one op per message (ops) until SHUTDOWN.

Exit status: 0 after SHUTDOWN, 1 when the launcher aborted (it sends ABORT
with the reason first), 2 when the channel failed or the starter broke the
protocol.
"""

import _socket
import os
import sys

from launcher import protocol
from launcher.protocol import Channel, ProtocolError

EXIT_ABORTED = 1
EXIT_CHANNEL = 2


def _import_dir(fd: int) -> None:
    """python-prctl and cffi's backend come from the directory the starter checked and sent."""
    sys.path.append(f"/proc/self/fd/{fd}")


def outer_launcher(staging_fd: int, socket_name: str, cgroup_fd: int | None) -> int:
    from launcher import rendezvous

    if cgroup_fd is not None:
        os.set_inheritable(cgroup_fd, False)

    nonce = rendezvous.read_nonce()
    channel = rendezvous.connect(f"/proc/self/fd/{staging_fd}/{socket_name}")
    os.close(staging_fd)
    phase = "rendezvous"
    try:
        setup = rendezvous.receive_setup(channel, nonce)
        _import_dir(setup.import_dir)
        from launcher import mounts, reexec

        phase = "capabilities"
        trees = []
        for directory_fd, target, attributes in [
            *((fd, target, mounts.CAPABILITY_ATTRIBUTES) for fd, target in setup.capabilities),
            *((fd, target, mounts.OUTPUT_ATTRIBUTES) for fd, target in setup.outputs),
            *((fd, target, mounts.CAPABILITY_ATTRIBUTES) for fd, target in setup.executables),
        ]:
            channel.leaf("MOUNT_INTENT", target=target, kind="tree")
            trees.append((mounts.clone_tree(directory_fd, attributes), target))
            os.close(directory_fd)
        phase = "sealing"
        source_fd = int(sys.argv[0].rsplit("/", 1)[1])
        memfd = reexec.sealed_copy(source_fd, setup.fields["digest"])
        phase = "re-exec"
        child_seq = channel.send_seq
        arguments = [
            "pid1",
            str(channel.sock.fileno()),
            str(child_seq + 1),
            str(channel.recv_seq),
            str(setup.import_dir),
            str(memfd),
            str(setup.op_cgroup),
            protocol.encode("SETUP", 0, setup.fields).hex(),
            *(f"{tree}={target}" for tree, target in trees),
        ]
        keep = [channel.sock.fileno(), setup.import_dir, setup.op_cgroup, *(tree for tree, _ in trees)]
        pid, failure = reexec.clone_into_namespaces(
            setup.interpreter, setup.interpreter_path, memfd, arguments, keep, cgroup_fd
        )
        channel.send("CHILD", pid=pid)
        if failure:
            channel.abort(f"re-exec: {failure}")
            return EXIT_ABORTED
        return 0
    except ProtocolError:
        return EXIT_CHANNEL
    except Exception as error:  # every other failure is reported to the starter, then ends the launcher
        channel.abort(f"{phase}: {type(error).__name__}: {error}")
        return EXIT_ABORTED


def pid_one(arguments: list[str]) -> int:
    socket_fd, send_seq, recv_seq, import_fd, memfd, op_cgroup = (int(item) for item in arguments[:6])
    _, _, setup = protocol.decode(bytes.fromhex(arguments[6]))
    trees = [(int(tree), target) for tree, _, target in (item.partition("=") for item in arguments[7:])]
    channel = Channel(_socket.socket(fileno=socket_fd), protocol.LAUNCHER, send_seq=send_seq, recv_seq=recv_seq)
    phase = "re-entry"
    try:
        _import_dir(import_fd)
        # Everything pid 1 will ever import, before the root switch takes the host's files away.
        from launcher import drop, kernel, limits, mounts, network, ops, reexec, seccomp

        reexec.verify_reentry(memfd, setup["digest"], sys.argv[0], reexec.__file__)
        channel.await_ack(send_seq - 1)
        phase = "bootstrap"

        def journal(name: str, target: str, kind: str) -> None:
            channel.leaf(name, target=target, kind=kind)

        builder = mounts.Builder(journal)
        builder.root()
        for tree, target in trees:
            builder.attach(tree, target)
        hidepid = builder.proc()
        builder.dev()
        builder.scratch("/tmp", setup["tmp_bytes"], setup["uid"], setup["gid"])
        builder.scratch("/work", setup["work_bytes"], setup["uid"], setup["gid"])
        network.loopback_up()
        network.set_hostname(setup["hostname"])
        limits.apply_bootstrap_limits(
            processes=setup["rlimit_nproc"],
            files=setup["rlimit_nofile"],
            file_size=setup["rlimit_fsize"],
        )
        kernel.exempt_from_oom_killer()
        kernel.join_fresh_session_keyring()
        builder.pivot()
        last_capability = drop.last_capability()
        drop.close_descriptors_but(socket_fd, op_cgroup)
        phase = "drop"
        drop.drop(setup["uid"], setup["gid"], last_capability)
        observations = drop.prove(setup["uid"], setup["gid"])
        kernel.create_user_keyrings()
        phase = "filter"
        inherited = seccomp.inherited_filters()
        seccomp.install(setup["seccomp_program"])
        observations.update(seccomp.observe(setup["seccomp_program"]))
        seccomp.check(observations, inherited)
        channel.leaf("READY", proc_hidepid=hidepid, **observations)
        phase = "ops"
        while True:
            message = channel.receive("OP", "SHUTDOWN")
            channel.ack(message)
            if message.name == "SHUTDOWN":
                return 0
            ops.run(channel, message.fields, op_cgroup)
    except ProtocolError:
        return EXIT_CHANNEL
    except Exception as error:  # every other failure is reported to the starter, then ends the sandbox
        channel.abort(f"{phase}: {type(error).__name__}: {error}")
        return EXIT_ABORTED


def main() -> None:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "stage1":
        code = outer_launcher(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else None)
    elif len(sys.argv) >= 9 and sys.argv[1] == "pid1":
        code = pid_one(sys.argv[2:])
    else:
        print("casebox launcher: started without its starter", file=sys.stderr)
        code = EXIT_CHANNEL
    sys.stdout.flush()
    os._exit(code)
