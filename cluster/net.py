"""The cluster's network: one Linux network namespace per host, each with one veth pair whose other end is on
one bridge in the namespace the harness started in. Hosts reach each other over the bridge (10.211.0.0/24)
and nothing else: no route leaves the bridge, and the bridge itself has no address, so no process outside
the namespaces reaches them.

Every name starts with `hl-`. `Network.remove()` deletes every namespace, veth and the bridge it made, and
runs from a `finally` and an `atexit` hook, so a failed or interrupted run leaves none behind.

Hand-written over `ip` (iproute2): pyroute2 would do the same calls through a library the project doesn't
otherwise need, and the harness only needs a dozen commands.
"""
import atexit
import ctypes
import os
import subprocess

SUBNET = '10.211.0'
BRIDGE = 'hl-br0'
CLONE_NEWNET = 0x40000000


def ip(*args, check=True):
    return subprocess.run(['ip', *args], check=check, capture_output=True, text=True)


class Network:
    def __init__(self, hosts):
        """`hosts`: {name: last octet}; a host `api1` is namespace `hl-api1` at 10.211.0.<octet>."""
        self.hosts = dict(hosts)
        self.made = []  # ('ns', name) / ('link', name), in creation order
        self._home = None  # an fd of the namespace the harness started in, while it is inside another
        atexit.register(self.remove)

    def address(self, host):
        return f'{SUBNET}.{self.hosts[host]}'

    @staticmethod
    def namespace(host):
        return f'hl-{host}'

    def create(self):
        self.remove_leftovers()
        ip('link', 'add', BRIDGE, 'type', 'bridge')
        self.made.append(('link', BRIDGE))
        ip('link', 'set', BRIDGE, 'up')
        for host in self.hosts:
            ns, outside = self.namespace(host), f'hl-{host}-b'
            ip('netns', 'add', ns)
            self.made.append(('ns', ns))
            ip('link', 'add', outside, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns)
            self.made.append(('link', outside))
            ip('link', 'set', outside, 'master', BRIDGE)
            ip('link', 'set', outside, 'up')
            ip('-n', ns, 'addr', 'add', f'{self.address(host)}/24', 'dev', 'eth0')
            ip('-n', ns, 'link', 'set', 'eth0', 'up')
            ip('-n', ns, 'link', 'set', 'lo', 'up')
        return self

    def link(self, host, up):
        """Cut a host off the bridge (its own end of the pair down) or put it back."""
        ip('-n', self.namespace(host), 'link', 'set', 'eth0', 'up' if up else 'down')

    def enter(self, host):
        """Move this process (it must have no other thread yet) into `host`'s namespace; `remove()` moves it
        back first."""
        libc = ctypes.CDLL(None, use_errno=True)
        self._home = os.open('/proc/self/ns/net', os.O_RDONLY)
        fd = os.open(f'/run/netns/{self.namespace(host)}', os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f'setns into {self.namespace(host)}')
        finally:
            os.close(fd)

    def _go_home(self):
        if self._home is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(self._home, CLONE_NEWNET)
        os.close(self._home)
        self._home = None

    def remove(self):
        self._go_home()
        for kind, name in reversed(self.made):
            if kind == 'ns':
                ip('netns', 'del', name, check=False)
            else:
                ip('link', 'del', name, check=False)
        self.made.clear()

    def remove_leftovers(self):
        """What a run killed before its cleanup left: this harness's own names only."""
        for host in self.hosts:
            ip('netns', 'del', self.namespace(host), check=False)
            ip('link', 'del', f'hl-{host}-b', check=False)
        ip('link', 'del', BRIDGE, check=False)
