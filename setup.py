"""The repo-root conf/ directory ships inside the wheel as the package sglang_hydra.conf."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["sglang_hydra", "sglang_hydra.*"]) + ["sglang_hydra.conf"],
    package_dir={"sglang_hydra.conf": "conf"},
)
