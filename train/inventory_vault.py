"""The inventory's `!vault` values tandem reads, opened with the user's vault password by Ansible's own API.

A vaulted value travels sealed, as Ansible's JSON writes it ({"__ansible_vault": ciphertext}), through
train.inventory_cache (so the cache never holds its plaintext) and is opened only in memory, as a host
is built. The password is the one ansible-playbook uses: ANSIBLE_VAULT_PASSWORD_FILE or ansible.cfg's
vault_password_file, and ANSIBLE_VAULT_IDENTITY_LIST / vault_identity_list; never a prompt (fab runs in
scripts and in parallel).
"""

from __future__ import annotations

import functools

from .errors import ClusterError

SEALED = "__ansible_vault"


def sealed(value: object) -> dict | None:
    """{"__ansible_vault": ciphertext} for a vaulted value Ansible read, None for any other."""
    from ansible.parsing.vault import VaultHelper

    ciphertext = VaultHelper.get_ciphertext(value, with_tags=False)
    return {SEALED: str(ciphertext)} if ciphertext else None


def is_sealed(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {SEALED}


def opened(host: str, variables: dict) -> dict:
    """`variables` with each sealed value decrypted; the others as they are (no Ansible loaded then)."""
    if not any(is_sealed(v) for v in variables.values()):
        return variables
    return {name: _decrypt(host, name, v[SEALED]) if is_sealed(v) else v for name, v in variables.items()}


def _decrypt(host: str, name: str, ciphertext: str) -> str:
    from ansible.errors import AnsibleError
    from ansible.module_utils.common.text.converters import to_text
    from ansible.parsing.vault import VaultLib

    try:
        return to_text(VaultLib(_secrets()).decrypt(ciphertext))
    except AnsibleError as err:
        raise ClusterError(f"{host}: {name} is vaulted and could not be decrypted ({' '.join(str(err).split())}): "
                           "give fab your vault password file as ansible-playbook gets it "
                           "(ANSIBLE_VAULT_PASSWORD_FILE, or vault_password_file in ansible.cfg)") from None


def _secrets() -> list:
    """The vault secrets ansible-playbook would load (its config read now, not at ansible.constants' import)."""
    from ansible import constants

    file = constants.config.get_config_value("DEFAULT_VAULT_PASSWORD_FILE")
    ids = constants.config.get_config_value("DEFAULT_VAULT_IDENTITY_LIST") or []
    return list(_loaded(file, tuple(ids)))


@functools.cache
def _loaded(file: str | None, ids: tuple[str, ...]) -> tuple:
    """Secrets read once a process: a password script runs once, not once a host."""
    from ansible.cli import CLI
    from ansible.parsing.dataloader import DataLoader

    return tuple(CLI.setup_vault_secrets(DataLoader(), vault_ids=list(ids), vault_password_files=[file] if file else [],
                                         auto_prompt=False, initialize_context=False))
