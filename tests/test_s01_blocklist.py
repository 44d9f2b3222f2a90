"""s01's regex blocklist (DANGEROUS): power-state commands and a glob delete
after a cd to / or home. The list is carried into every chapter, so it is
checked on each copy; check_dangerous refuses the same lines in every chapter
(from s07 on through the parsed judge).
"""
import re

import pytest

from conftest import chapters_from

pytestmark = pytest.mark.parametrize("mod", chapters_from("s01"), indirect=True)

REFUSED = [
    "shutdown -h now", "reboot", "halt", "poweroff", "/sbin/shutdown -r +5", "ls && reboot",
    "make; poweroff", "init 0", "init 6", "telinit 6", "systemctl poweroff", "systemctl reboot",
    "systemctl --force halt", "systemctl kexec",
    "cd / && rm -rf *", "cd ~; rm -rf .*", "cd\nrm -rf *", "cd && rm -rf ./*", 'cd "$HOME" && rm -rf *',
    "cd ${HOME}/; rm -fr *",
]
ALLOWED = [
    "man shutdown", "grep reboot /var/log/syslog", "systemctl status", "git commit -m 'reboot'",
    "echo init 6", "git init", "./halt_test.sh", "cat shutdown.log",
    "cd /tmp && rm -rf *", "cd ~/proj && rm -rf *", "cd build; rm -rf *", "cd / && ls",
]


def matched(mod, command):
    return [why for pattern, why in mod.DANGEROUS if re.search(pattern, command)]


@pytest.mark.parametrize("command", REFUSED)
def test_regex_list_refuses(mod, command):
    assert matched(mod, command)
    assert mod.check_dangerous(command)


@pytest.mark.parametrize("command", ALLOWED)
def test_regex_list_allows_look_alikes(mod, command):
    assert not matched(mod, command)
    assert mod.check_dangerous(command) is None
